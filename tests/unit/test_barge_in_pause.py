"""Speech over a WebRTC reply pauses it; a backchannel lets it play on, words addressed to it interrupt it
(gateway/realtime/barge_in.py, driven through the core)."""

from __future__ import annotations

import numpy as np
import pytest

from gateway.realtime.barge_in import REHOLD_AFTER_MS, is_backchannel
from gateway.realtime.commands import (
    ClearPlayout,
    CreateResponse,
    DropTurn,
    HoldPlayout,
    Output,
    PauseEnded,
    StartSpeculation,
    StopResponse,
)
from gateway.realtime.core import RealtimeCore
from gateway.realtime.inputs import (
    AudioProcessed,
    ResponseEnded,
    ResponseStarted,
    SilenceHeard,
    SpeechBegan,
    SpeechEnded,
    TranscriptFinal,
    TranscriptSpeculated,
    TurnReady,
)
from gateway.realtime.response_events import ResponseEvents
from inference.transcript_checks import LEAST_READABLE_LOGPROB
from media.playout import PlayoutBuffer
from tests.unit.test_realtime_core import Clock, committed_turn, event, make_core, reply, spoken, start_reply, types


@pytest.mark.parametrize("text", ["", "Mm-hm.", "Yeah.", "Right, right.", "Uh-huh.", "Okay.", "I see.", "Yes.",
                                  "Mmmmmm.", "M M M M M M M M M M M M", "Hmmm.", "Mm, yeah, okay, right."])
def test_backchannels(text: str) -> None:
    assert is_backchannel(text, avg_logprob=-0.3)


@pytest.mark.parametrize("text", ["Wait, stop.", "What about Berlin?", "No.", "Yeah, but what about Paris?",
                                  "Okay, tell me more."])
def test_words_addressed_to_the_assistant(text: str) -> None:
    assert not is_backchannel(text, avg_logprob=-0.3)
    assert not is_backchannel(text, avg_logprob=None)  # a confidence not measured changes nothing


@pytest.mark.parametrize("text", ["and the MHCM.", "You", "Tell me more.", "Mmm, Mmm, Mmm, Mmm."])
def test_a_few_words_whisper_is_unsure_of_are_nothing_readable(text: str) -> None:
    assert is_backchannel(text, avg_logprob=LEAST_READABLE_LOGPROB - 0.1)
    assert is_backchannel(text, avg_logprob=-1.0, least_readable=-0.9)


@pytest.mark.parametrize("text", ["Yeah, I'm gonna have milk.", "Tell me about Berlin instead."])
def test_more_words_than_a_backchannel_are_for_the_assistant_however_unsure(text: str) -> None:
    """Whisper mishears a sentence in an unfamiliar voice, unsure of it; a misheard backchannel is a few words."""
    assert not is_backchannel(text, avg_logprob=-1.5)


@pytest.mark.parametrize("text", ["Wait.", "No, stop.", "Stop, tell me about Berlin instead.", "Hold on."])
def test_a_command_is_for_the_assistant_however_unsure_whisper_is(text: str) -> None:
    assert not is_backchannel(text, avg_logprob=-1.9)


def speaking_reply(*, playout: bool = True) -> tuple[RealtimeCore, Clock, ResponseEvents]:
    core, clock = make_core(playout=playout)
    core.resumes_false_interruptions = True
    events = start_reply(core)
    spoken(core, events, ("Once upon a time there was a dragon.", 2000))
    clock.seconds += 1.0  # past the echo guard
    return core, clock, events


def test_a_backchannel_pauses_the_reply_then_it_plays_on_whole() -> None:
    core, _, events = speaking_reply()
    began = core.handle(SpeechBegan("item_u", audio_start_ms=0))
    assert HoldPlayout(True) in began and not any(isinstance(o, (StopResponse, ClearPlayout)) for o in began)
    ready = committed_turn(core, "item_u", "Mm-hm.")
    assert [event(o)["type"] for o in ready if types([o])[0].startswith("conversation")] == ["conversation.item.deleted"]
    assert HoldPlayout(False) in ready and DropTurn("item_u") in ready
    assert not any(isinstance(o, (StopResponse, ClearPlayout)) for o in ready)
    assert core.response is not None and "item_u" not in [item.id for item in core.conversation.items]
    assert core.conversation.get(events.item.id).status != "incomplete"
    # It can be interrupted again: words now stop it.
    core.handle(SpeechBegan("item_v", audio_start_ms=3000))
    ready = committed_turn(core, "item_v", "Wait, what about Berlin?")
    assert StopResponse("resp_1", "turn_detected", True) in ready


def test_words_over_the_paused_reply_interrupt_it() -> None:
    core, _, _ = speaking_reply()
    core.handle(SpeechBegan("item_u", audio_start_ms=0))
    ready = committed_turn(core, "item_u", "Stop, tell me about Berlin instead.")
    assert StopResponse("resp_1", "turn_detected", True) in ready and ClearPlayout(None) in ready
    # The hold ends cut, said before the audio is dropped (the metrics count it once).
    assert [o for o in ready if isinstance(o, PauseEnded)] == [PauseEnded("interrupted", 0.0)]
    assert ready.index(PauseEnded("interrupted", 0.0)) < ready.index(ClearPlayout(None))
    assert "item_u" in [item.id for item in core.conversation.items]  # the turn is answered once the reply ends
    assert core.handle(ResponseEnded("resp_1", "cancelled", {}))[-1].turn == "item_u"  # type: ignore[union-attr]


def heard_turn(core: RealtimeCore, item_id: str, text: str, avg_logprob: float, *, began: bool = True) -> list[Output]:
    """A VAD turn (`began`: its speech starts here) whose final transcript Whisper gave with `avg_logprob`; returns
    TurnReady's outputs."""
    if began:
        core.handle(SpeechBegan(item_id, audio_start_ms=0))
    core.handle(SpeechEnded(item_id, audio_end_ms=700))
    core.handle(TranscriptFinal(item_id, text, audio_seconds=0.7, avg_logprob=avg_logprob))
    return core.handle(TurnReady(item_id))


def test_words_whisper_is_unsure_of_over_the_paused_reply_let_it_play_on() -> None:
    """Piper's "Mm-hm." as Whisper tiny.en hears it: words, but a guess (the turn-taking bench measured -0.88)."""
    core, _, events = speaking_reply()
    ready = heard_turn(core, "item_u", "and the MHCM.", avg_logprob=-0.88)
    assert HoldPlayout(False) in ready and DropTurn("item_u") in ready
    assert not any(isinstance(o, (StopResponse, ClearPlayout)) for o in ready)
    assert core.response is not None and "item_u" not in [item.id for item in core.conversation.items]
    assert core.conversation.get(events.item.id).status != "incomplete"


def test_a_confident_sentence_over_the_paused_reply_interrupts_it() -> None:
    core, _, _ = speaking_reply()
    ready = heard_turn(core, "item_u", "Stop, that's the wrong address.", avg_logprob=-0.23)
    assert StopResponse("resp_1", "turn_detected", True) in ready and ClearPlayout(None) in ready
    assert "item_u" in [item.id for item in core.conversation.items]


def test_an_unsure_transcript_with_no_reply_paused_is_answered() -> None:
    """The confidence decides only over a paused reply: a turn of its own is answered whatever Whisper's doubt."""
    core, _ = make_core(playout=True)
    core.resumes_false_interruptions = True
    [create] = heard_turn(core, "item_u", "and the MHCM.", avg_logprob=-0.88)
    assert isinstance(create, CreateResponse) and create.turn == "item_u"


def test_speech_voiced_longer_than_a_backchannel_interrupts_without_waiting_for_its_words() -> None:
    core, clock, _ = speaking_reply()
    core.handle(SpeechBegan("item_u", audio_start_ms=0))
    assert not any(isinstance(o, StopResponse) for o in core.handle(AudioProcessed(500, turn_voiced_ms=500)))
    clock.seconds += 1.3
    assert StopResponse("resp_1", "turn_detected", True) in core.handle(AudioProcessed(1800, turn_voiced_ms=1200))


def test_a_turn_kept_open_long_after_a_short_word_is_still_a_backchannel() -> None:
    """Issue 47: semantic_vad's judges keep "yeah" (0.26 s of sound) open for seconds on a busy machine; its length
    is its voiced audio, so the reply is not interrupted for the judges' slowness, and its words let it play on."""
    core, clock, events = speaking_reply()
    core.handle(SpeechBegan("item_u", audio_start_ms=0))
    for step in range(1, 40):  # 4 s of a turn the detector keeps open, 260 ms of it voiced
        clock.seconds += 0.1
        outputs = core.handle(AudioProcessed(100 * step, turn_voiced_ms=260))
        assert not any(isinstance(o, (StopResponse, ClearPlayout)) for o in outputs)
    assert core.handle(TranscriptSpeculated("item_u", "Yeah.", avg_logprob=-0.3)) == [
        HoldPlayout(False), PauseEnded("resumed", pytest.approx(3.9))]  # held from the speech's start to its words
    ready = heard_turn(core, "item_u", "Yeah.", avg_logprob=-0.3, began=False)
    assert DropTurn("item_u") in ready and HoldPlayout(False) not in ready  # it already plays
    assert not any(isinstance(o, (StopResponse, ClearPlayout)) for o in ready)
    assert "item_u" not in [item.id for item in core.conversation.items]
    assert core.conversation.get(events.item.id).status != "incomplete"


def test_the_speculative_words_decide_before_the_turn_ends() -> None:
    core, _, _ = speaking_reply()
    core.handle(SpeechBegan("item_u", audio_start_ms=0))
    core.handle(AudioProcessed(400, turn_voiced_ms=300))
    assert core.handle(TranscriptSpeculated("item_u", "Mm-hm.", avg_logprob=-0.4)) == [
        HoldPlayout(False), PauseEnded("resumed", 0.0)]
    assert core.handle(TranscriptSpeculated("item_u", "Mm-hm.", avg_logprob=-0.4)) == []  # decided already

    interrupted, _, _ = speaking_reply()
    interrupted.handle(SpeechBegan("item_u", audio_start_ms=0))
    interrupted.handle(TranscriptSpeculated("item_v", "Stop.", avg_logprob=-0.2))  # not the turn holding it
    assert not interrupted.handle(AudioProcessed(400, turn_voiced_ms=300))
    outputs = interrupted.handle(TranscriptSpeculated("item_u", "Stop.", avg_logprob=-0.2))
    assert StopResponse("resp_1", "turn_detected", True) in outputs and ClearPlayout(None) in outputs


def test_speech_again_after_a_backchannel_holds_the_reply_again_once_voiced_the_rehold_length() -> None:
    """ "Yeah... what about Berlin?": the reply plays on after "yeah", and through the rehold length of more speech
    ("Yeah, right." ends within it); past it the reply is held again, and the turn's words interrupt it."""
    core, _, _ = speaking_reply()
    core.handle(SpeechBegan("item_u", audio_start_ms=0))
    core.handle(AudioProcessed(400, turn_voiced_ms=300))
    core.handle(TranscriptSpeculated("item_u", "Yeah.", avg_logprob=-0.3))
    assert core.handle(AudioProcessed(500, turn_voiced_ms=300)) == []  # still silent
    assert core.handle(AudioProcessed(600, turn_voiced_ms=300 + REHOLD_AFTER_MS)) == []  # within the length
    assert core.handle(AudioProcessed(700, turn_voiced_ms=300 + REHOLD_AFTER_MS + 32)) == [HoldPlayout(True)]
    assert core.handle(AudioProcessed(800, turn_voiced_ms=300 + REHOLD_AFTER_MS + 64)) == []  # held already
    ready = heard_turn(core, "item_u", "Yeah, what about Berlin?", avg_logprob=-0.3, began=False)
    assert StopResponse("resp_1", "turn_detected", True) in ready


def test_words_spoken_on_over_a_reply_that_plays_on_decide_it() -> None:
    """Speech after "yeah" within the rehold length is not held, but its words are judged as they come: more
    backchannel words play on (and speech is counted from them), anything else interrupts at once."""
    core, _, _ = speaking_reply()
    core.handle(SpeechBegan("item_u", audio_start_ms=0))
    core.handle(AudioProcessed(400, turn_voiced_ms=300))
    core.handle(TranscriptSpeculated("item_u", "Yeah.", avg_logprob=-0.3))
    core.handle(AudioProcessed(600, turn_voiced_ms=300 + REHOLD_AFTER_MS))
    assert core.handle(TranscriptSpeculated("item_u", "Yeah, right.", avg_logprob=-0.3)) == []
    # From those words on, the rehold length counts again.
    assert core.handle(AudioProcessed(800, turn_voiced_ms=300 + 2 * REHOLD_AFTER_MS)) == []
    outputs = core.handle(TranscriptSpeculated("item_u", "Yeah, right, but stop.", avg_logprob=-0.3))
    assert StopResponse("resp_1", "turn_detected", True) in outputs and ClearPlayout(None) in outputs


def test_over_a_reply_that_plays_on_the_speculative_transcript_still_runs_where_a_partial_covers_the_speech() -> None:
    core, _, _ = speaking_reply()
    core.handle(SpeechBegan("item_u", audio_start_ms=0))
    core.handle(AudioProcessed(400, turn_voiced_ms=300))
    core.handle(TranscriptSpeculated("item_u", "Yeah.", avg_logprob=-0.3))
    core.handle(SilenceHeard("item_u", silence_ms=None, speech=True, covered=False))
    started = core.handle(SilenceHeard("item_u", silence_ms=64, speech=False, covered=True))
    assert [type(o) for o in started] == [StartSpeculation]
    assert not started[0].preempt  # type: ignore[attr-defined]


def test_a_held_reply_with_no_words_plays_on_and_its_final_transcript_still_decides() -> None:
    core, clock, _ = speaking_reply()
    core.handle(SpeechBegan("item_u", audio_start_ms=0))
    core.handle(SpeechEnded("item_u", audio_end_ms=700))
    clock.seconds += 2.9
    assert core.handle(AudioProcessed(3000)) == []
    clock.seconds += 0.2
    # The transcript is late: it plays on.
    assert core.handle(AudioProcessed(3200)) == [HoldPlayout(False), PauseEnded("resumed", pytest.approx(3.1))]
    core.handle(TranscriptFinal("item_u", "Stop, that's the wrong address.", audio_seconds=0.7, avg_logprob=-0.2))
    assert StopResponse("resp_1", "turn_detected", True) in core.handle(TurnReady("item_u"))


def test_a_new_reply_replacing_a_held_one_ends_the_hold_cut() -> None:
    """A reply that has finished generating is held by speech over it; a client's response.create replaces it:
    its hold ends `interrupted`, and the turn spoken over it is a turn of its own (no longer a backchannel's)."""
    core, clock, events = speaking_reply()
    core.handle(ResponseEnded("resp_1", "completed", {}))  # generated; its audio still plays
    core.handle(SpeechBegan("item_u", audio_start_ms=0))
    clock.seconds += 0.5
    started = core.handle(ResponseStarted(reply(core, "resp_2"), writes_conversation=True, open_message=True))
    assert [o for o in started if isinstance(o, PauseEnded)] == [PauseEnded("interrupted", pytest.approx(0.5))]
    assert ClearPlayout(events.item.id) in started and not core.overlap_open


def test_a_new_turn_over_a_reply_that_plays_on_holds_it_again() -> None:
    core, _, _ = speaking_reply()
    core.handle(SpeechBegan("item_u", audio_start_ms=0))
    core.handle(TranscriptSpeculated("item_u", "Yeah.", avg_logprob=-0.3))
    core.handle(SpeechEnded("item_u", audio_end_ms=700))  # its transcript is still being made
    assert HoldPlayout(True) in core.handle(SpeechBegan("item_v", audio_start_ms=900))
    core.handle(TranscriptFinal("item_u", "Yeah.", audio_seconds=0.7, avg_logprob=-0.3))
    ready = core.handle(TurnReady("item_u"))
    assert DropTurn("item_u") in ready and HoldPlayout(False) not in ready  # item_v still holds it
    assert core.handle(TranscriptSpeculated("item_v", "Right.", avg_logprob=-0.3)) == [
        HoldPlayout(False), PauseEnded("resumed", 0.0)]


def test_over_a_websocket_speech_interrupts_at_once() -> None:
    """The client plays the audio there: what it was sent, it has."""
    core, _, _ = speaking_reply(playout=False)
    assert StopResponse("resp_1", "turn_detected", True) in core.handle(SpeechBegan("item_u", audio_start_ms=0))


def test_off_any_speech_interrupts_at_once() -> None:
    core, clock = make_core(playout=True)
    events = start_reply(core)
    spoken(core, events, ("Once upon a time.", 2000))
    clock.seconds += 1.0
    assert StopResponse("resp_1", "turn_detected", True) in core.handle(SpeechBegan("item_u", audio_start_ms=0))


def test_a_held_playout_sends_silence_and_keeps_its_place() -> None:
    buffer = PlayoutBuffer(48000, 960)
    buffer.write("item_a", np.arange(1, 2 * 960 + 1, dtype=np.int16))
    first = buffer.read_frame()
    assert first.started and first.audio_samples == 960
    buffer.hold(True)
    held = buffer.read_frame()
    assert held.audio_samples == 0 and not held.stopped and not held.pcm.any()
    assert buffer.played_ms("item_a") == 20.0
    buffer.hold(False)
    second = buffer.read_frame()
    assert second.pcm[0] == 961 and second.stopped  # on from where it paused, then drained


def test_over_a_held_reply_the_speculative_transcript_runs_even_where_a_partial_covers_the_speech() -> None:
    """Its words come with Whisper's confidence, which a partial's do not: they decide the held reply."""
    core, _, _ = speaking_reply()
    core.handle(SpeechBegan("item_u", audio_start_ms=0))
    started = core.handle(SilenceHeard("item_u", silence_ms=64, speech=False, covered=True))
    assert [type(o) for o in started] == [StartSpeculation]
    assert not started[0].preempt  # type: ignore[attr-defined]  # no reply ahead to words over a held reply
