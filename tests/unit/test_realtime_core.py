"""The realtime core on its own: inputs in, events and commands out. No sockets, tasks or models; the
races (barge-in, truncation, push-to-talk, cancel against commit or against the end) are inputs in an order."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from gateway.protocol.client_events import ResponseParams
from gateway.protocol.errors import ApiError
from gateway.protocol.session_config import SemanticVad, SessionConfig, TurnDetection
from gateway.realtime.commands import (
    ClearPlayout,
    ConfigureListening,
    CreateResponse,
    DiscardSpeculation,
    DropTurn,
    Output,
    PrefillDraft,
    ResponseFinished,
    Send,
    SendError,
    SetProducing,
    SetSilence,
    StartSpeculation,
    StopResponse,
    Transcribe,
)
from gateway.realtime.conversation import Conversation, Item, SpokenSegment
from gateway.realtime.core import RealtimeCore
from gateway.realtime.inputs import (
    AudioCommitted,
    AudioDelta,
    AudioProcessed,
    CancelRequested,
    ClauseSpoken,
    ConfigChanged,
    EndOfTurnJudged,
    IllegalInput,
    ItemCreated,
    ItemDelete,
    MetadataAdded,
    PlayoutCleared,
    PlayoutStopped,
    ReplyWhenFree,
    ResponseEnded,
    ResponseRequested,
    ResponseStarted,
    SessionStarted,
    SilenceHeard,
    SpeechBegan,
    SpeechEnded,
    SpeechWritten,
    TextDelta,
    TranscriptFailed,
    TranscriptFinal,
    TranscriptPartial,
    TurnReady,
)
from gateway.realtime.outbox import Outbox, OutboxReader
from gateway.realtime.response_events import ResponseEvents
from inference.asr import TranscriptStabilizer


class Clock:
    def __init__(self) -> None:
        self.seconds = 100.0

    def __call__(self) -> float:
        return self.seconds


def make_core(*, detection: TurnDetection | None = None, manual: bool = False, playout: bool = False,
              max_items: int = 100, **config: object) -> tuple[RealtimeCore, Clock]:
    settings = SessionConfig(id="sess_1", model="m", output_modalities=["audio"], **config)  # type: ignore[arg-type]
    settings.audio.input.turn_detection = None if manual else (detection or TurnDetection())
    clock = Clock()
    core = RealtimeCore(settings, Conversation(max_items=max_items, max_bytes=1 << 20), clock=clock,
                        stabilizer=TranscriptStabilizer,
                        echo_guard_ms=300, can_speak=True, has_playout=playout)
    core.handle(SessionStarted(None))
    return core, clock


def types(outputs: list[Output]) -> list[str]:
    """Events by their type, commands by their class name."""
    return [o.event["type"] if isinstance(o, Send) else type(o).__name__ for o in outputs]


def event(output: Output) -> dict[str, Any]:
    assert isinstance(output, Send)
    return output.event


async def take(reader: OutboxReader) -> dict[str, Any]:
    wire = await asyncio.wait_for(reader.next(), 1)
    assert wire is not None
    return json.loads(wire)


def reply(core: RealtimeCore, response_id: str = "resp_1", *, audio: bool = True) -> ResponseEvents:
    item = Item(id=f"item_{response_id}", type="message", role="assistant", status="in_progress")
    return ResponseEvents(response_id=response_id, conversation_id=core.conversation.id, item=item, audio=audio,
                          audio_format={"type": "audio/pcm", "rate": 24000}, voice="alloy", max_output_tokens="inf")


def start_reply(core: RealtimeCore, response_id: str = "resp_1", *, audio: bool = True) -> ResponseEvents:
    events = reply(core, response_id, audio=audio)
    core.handle(ResponseStarted(events, writes_conversation=True, open_message=True))
    return events


def spoken(core: RealtimeCore, events: ResponseEvents, *clauses: tuple[str, float]) -> None:
    """As the runner reports speech: each clause's audio in two writes, then the clause."""
    for text, ms in clauses:
        assert core.handle(SpeechWritten(events.response_id, ms / 4)) == []
        assert core.handle(SpeechWritten(events.response_id, 3 * ms / 4)) == []
        assert core.handle(ClauseSpoken(events.response_id, text)) == []


def committed_turn(core: RealtimeCore, item_id: str, text: str = "What is the capital of France?") -> list[Output]:
    """A VAD turn from speech to its final transcript; returns TurnReady's outputs."""
    core.handle(SpeechBegan(item_id, audio_start_ms=0))
    assert core.handle(SpeechEnded(item_id, audio_end_ms=900))[-1] == Transcribe(item_id)
    core.handle(TranscriptFinal(item_id, text, audio_seconds=0.9))
    return core.handle(TurnReady(item_id))


def test_a_spoken_turn_is_committed_transcribed_then_answered() -> None:
    core, _ = make_core()
    assert types(core.handle(SpeechBegan("item_u", audio_start_ms=120))) == [
        "input_audio_buffer.speech_started", "PrefillDraft"]
    assert types(core.handle(SpeechEnded("item_u", audio_end_ms=900))) == [
        "input_audio_buffer.speech_stopped", "input_audio_buffer.committed", "conversation.item.added", "Transcribe"]
    assert core.conversation.get("item_u").status == "in_progress"
    assert types(core.handle(TranscriptFinal("item_u", "Hello there", audio_seconds=0.9))) == [
        "conversation.item.input_audio_transcription.completed", "conversation.item.done"]
    [create] = core.handle(TurnReady("item_u"))
    assert create == CreateResponse(ResponseParams(), turn="item_u")


def test_noise_with_no_words_gets_no_reply_and_its_head_start_is_dropped() -> None:
    core, _ = make_core()
    assert core.handle(TurnReady("item_u")) == []  # not a committed turn: nothing
    assert types(committed_turn(core, "item_u", text="  ")) == ["DropTurn"]


def test_barge_in_clears_then_stops_the_reply_and_truncates_it_to_what_was_sent() -> None:
    core, clock = make_core()
    events = start_reply(core)
    core.handle(TextDelta("resp_1", "Paris is the capital. It is big."))
    spoken(core, events, ("Paris is the capital.", 1200), ("It is big.", 800))
    core.handle(AudioDelta("resp_1", "AAAA"))  # the echo guard starts with the first audio
    clock.seconds += 1.0
    outputs = core.handle(SpeechBegan("item_u", audio_start_ms=0))
    assert types(outputs) == ["input_audio_buffer.speech_started", "StopResponse"]
    assert outputs[1] == StopResponse("resp_1", "turn_detected", barge_in=True)
    assert core.handle(SpeechBegan("item_v", audio_start_ms=10))[1:] == []  # cancelling already: no second stop
    ended = core.handle(ResponseEnded("resp_1", "cancelled", {}, reason="turn_detected", heard_ms=1500))
    assert types(ended) == ["response.output_audio.done", "response.output_audio_transcript.done",
                            "response.content_part.done", "response.output_item.done", "conversation.item.done",
                            "response.done", "ResponseFinished", "PrefillDraft"]
    assert ended[-1] == PrefillDraft("item_v", "")  # the engine is free: the turn being spoken is prefilled
    done = event(ended[5])["response"]
    assert done["status"] == "cancelled" and done["status_details"]["reason"] == "turn_detected"
    # 1500 ms heard: the first clause and 300 of the second's 800 ms (its first word of three).
    assert events.item.content[0]["transcript"] == "Paris is the capital. It"
    assert core.response is None


def test_the_reply_s_speech_and_metadata_are_recorded_by_the_core_for_its_response_only() -> None:
    core, _ = make_core()
    start_reply(core, "resp_0")
    core.handle(CancelRequested("resp_0"))
    core.handle(ResponseEnded("resp_0", "cancelled", {}))
    events = start_reply(core)
    spoken(core, events, ("Paris is the capital.", 1200), ("It is big.", 800))
    assert events.item.audio_ms_sent == 2000
    assert events.item.spoken == [SpokenSegment("Paris is the capital.", 0, 1200), SpokenSegment("It is big.", 1200, 2000)]
    assert core.handle(MetadataAdded("resp_1", {"memories_used": "mem_1"})) == []
    # A stopped response's late writes (another id) change nothing.
    assert core.handle(SpeechWritten("resp_0", 500)) == [] and core.handle(ClauseSpoken("resp_0", "Old.")) == []
    assert core.handle(MetadataAdded("resp_0", {"memories_used": "mem_0"})) == []
    assert events.item.audio_ms_sent == 2000 and len(events.item.spoken) == 2
    ended = core.handle(ResponseEnded("resp_1", "completed", {}))
    assert event(ended[-2])["response"]["metadata"]["memories_used"] == "mem_1"
    assert core.handle(SpeechWritten("resp_1", 500)) == []  # ended: nothing more is its
    assert events.item.audio_ms_sent == 2000


def test_an_input_the_state_cannot_take_is_an_illegal_input_and_changes_nothing() -> None:
    """The session's table: only SessionStarted before the session is open, and only once; a response's input
    names a response in progress (or one that ended: a straggler, dropped), never one that did not exist."""
    settings = SessionConfig(id="sess_1", model="m")
    core = RealtimeCore(settings, Conversation(max_items=10, max_bytes=1 << 20), clock=Clock(),
                        stabilizer=TranscriptStabilizer)
    with pytest.raises(IllegalInput, match="SpeechBegan in session state new"):
        core.handle(SpeechBegan("item_u", audio_start_ms=0))
    assert core.open_turn is None
    assert types(core.handle(SessionStarted(None))) == ["session.created"]
    with pytest.raises(IllegalInput, match="SessionStarted in session state open"):
        core.handle(SessionStarted(None))
    events = start_reply(core, audio=False)
    before = json.dumps(events.item.to_wire())
    with pytest.raises(IllegalInput, match="resp_never"):
        core.handle(TextDelta("resp_never", "Hello"))
    assert json.dumps(events.item.to_wire()) == before and core.response is not None
    assert types(core.handle(TextDelta("resp_1", "Hi"))) == ["response.output_text.delta"]


def test_a_listening_session_hears_its_input_settings_as_it_starts_and_after_each_update() -> None:
    """The voice pipeline never reads the session's configuration: the core tells it, after the event that
    announces the change; a session without one is told nothing."""
    settings = SessionConfig(id="sess_1", model="m", output_modalities=["text"])
    core = RealtimeCore(settings, Conversation(max_items=10, max_bytes=1 << 20), clock=Clock(),
                        stabilizer=TranscriptStabilizer)
    started = core.handle(SessionStarted(None, listens=True))
    assert types(started) == ["session.created", "ConfigureListening"]
    assert started[-1] == ConfigureListening(settings.audio.input)
    updated = settings.model_copy(deep=True)
    updated.audio.input.turn_detection = SemanticVad(type="semantic_vad", eagerness="low")
    outputs = core.handle(ConfigChanged(updated))
    assert types(outputs) == ["session.updated", "ConfigureListening"]
    assert outputs[-1] == ConfigureListening(updated.audio.input)
    deaf, _ = make_core()
    assert types(deaf.handle(ConfigChanged(updated))) == ["session.updated"]


def test_the_echo_guard_defers_a_barge_in_until_speech_outlasts_it() -> None:
    core, clock = make_core()
    start_reply(core)
    core.handle(AudioDelta("resp_1", "AAAA"))
    clock.seconds += 0.1
    assert types(core.handle(SpeechBegan("item_u", audio_start_ms=0))) == ["input_audio_buffer.speech_started"]
    clock.seconds += 0.1
    assert core.handle(AudioProcessed(audio_end_ms=200)) == []
    clock.seconds += 0.2  # past the 300 ms window, still speaking
    assert types(core.handle(AudioProcessed(audio_end_ms=400))) == ["StopResponse"]


def test_webrtc_barge_in_after_generation_truncates_the_reply_to_what_was_played() -> None:
    core, _ = make_core(playout=True)
    events = start_reply(core)
    spoken(core, events, ("One two three four.", 2000))
    assert SetProducing(False) in core.handle(ResponseEnded("resp_1", "completed", {}))
    assert core.playout_busy  # generated, still playing: the turn machine still counts the bot as speaking
    outputs = core.handle(SpeechBegan("item_u", audio_start_ms=0))
    assert types(outputs) == ["input_audio_buffer.speech_started", "output_audio_buffer.cleared", "ClearPlayout",
                              "PrefillDraft"]
    assert outputs[2] == ClearPlayout(measure_item_id=events.item.id)
    [truncated] = core.handle(PlayoutCleared(events.item.id, played_ms=1000))
    assert event(truncated) == {"type": "conversation.item.truncated", "item_id": events.item.id, "content_index": 0,
                               "audio_end_ms": 1000}
    item = core.conversation.get(events.item.id)
    assert item.content[0]["transcript"] == "One two" and item.status == "incomplete"


def test_webrtc_playout_stopping_ends_the_bots_turn() -> None:
    core, clock = make_core(playout=True)
    events = start_reply(core)
    spoken(core, events, ("Paris.", 600))
    core.handle(ResponseEnded("resp_1", "completed", {}))
    assert core.playout_busy
    assert types(core.handle(PlayoutStopped(events.item.id))) == ["output_audio_buffer.stopped"]
    clock.seconds += 10
    assert types(core.handle(SpeechBegan("item_u", audio_start_ms=0))) == [
        "input_audio_buffer.speech_started", "PrefillDraft"]


def test_a_spoken_reply_that_wrote_no_audio_leaves_the_playout_free() -> None:
    """A reply that only called a function (or failed before its first clause) gets no PlayoutStopped: the
    playout has nothing of it. It had counted the assistant as speaking until the next reply."""
    core, clock = make_core(playout=True)
    start_reply(core)
    outputs = core.handle(ResponseEnded("resp_1", "completed", {}))
    assert "output_audio_buffer.stopped" not in types(outputs) and not core.playout_busy
    clock.seconds += 10
    assert types(core.handle(SpeechBegan("item_u", audio_start_ms=0))) == [
        "input_audio_buffer.speech_started", "PrefillDraft"]


def test_push_to_talk_response_create_waits_for_the_committed_transcript() -> None:
    core, _ = make_core(manual=True)
    assert types(core.handle(AudioCommitted("item_u"))) == [
        "input_audio_buffer.committed", "conversation.item.added", "Transcribe"]
    request = ResponseRequested(ResponseParams(), event_id="ev_1")
    assert core.handle(request) == []
    assert core.deferred_responses
    outputs = core.handle(TranscriptFinal("item_u", "Hello", audio_seconds=1.0))
    assert types(outputs) == ["conversation.item.input_audio_transcription.completed", "conversation.item.done",
                              "CreateResponse"]
    assert outputs[-1] == CreateResponse(ResponseParams(), event_id="ev_1")
    assert outputs[-1].answers is request  # the session handles the client's next event after this
    assert not core.deferred_responses
    assert core.handle(TurnReady("item_u")) == [DropTurn("item_u")]  # manual turns: the client decides


def test_push_to_talk_response_create_goes_on_when_the_transcription_fails() -> None:
    core, _ = make_core(manual=True)
    core.handle(AudioCommitted("item_u"))
    core.handle(ResponseRequested(ResponseParams(), event_id="ev_1"))
    outputs = core.handle(TranscriptFailed("item_u", ApiError("transcription_failed", "out of memory")))
    assert types(outputs) == ["conversation.item.input_audio_transcription.failed", "conversation.item.done",
                              "DropTurn", "CreateResponse"]
    assert core.conversation.get("item_u").status == "incomplete"


def test_a_commit_ends_the_turn_the_vad_had_opened() -> None:
    core, _ = make_core()
    core.handle(SpeechBegan("item_u", audio_start_ms=0))
    assert types(core.handle(AudioCommitted("item_u"))) == [
        "input_audio_buffer.committed", "conversation.item.added", "Transcribe"]
    assert core.open_turn is None
    assert core.handle(SpeechEnded("item_u", audio_end_ms=500)) == []  # the VAD's late edge changes nothing


def test_speech_during_a_preempted_turns_transcription_drops_its_reply() -> None:
    """Turn 1's reply was being generated ahead; the user speaks again before it is answered: no reply to
    turn 1 (its head start is dropped), and turn 2 gets one."""
    core, _ = make_core()
    core.handle(SpeechBegan("item_1", audio_start_ms=0))
    core.handle(SpeechEnded("item_1", audio_end_ms=900))
    core.handle(SpeechBegan("item_2", audio_start_ms=1000))
    core.handle(TranscriptFinal("item_1", "What is", audio_seconds=0.9))
    assert core.handle(TurnReady("item_1")) == [DropTurn("item_1")]
    core.handle(SpeechEnded("item_2", audio_end_ms=2000))
    core.handle(TranscriptFinal("item_2", "the capital of France?", audio_seconds=1.0))
    assert core.handle(TurnReady("item_2")) == [CreateResponse(ResponseParams(), turn="item_2")]


def test_barge_in_on_a_reply_that_adopted_its_preemption() -> None:
    core, _ = make_core()
    [create] = committed_turn(core, "item_1")
    assert create == CreateResponse(ResponseParams(), turn="item_1")
    start_reply(core)  # the driver built it from the turn's head start
    outputs = core.handle(SpeechBegan("item_2", audio_start_ms=0))  # generating, no audio yet: no echo guard
    assert outputs[-1] == StopResponse("resp_1", "turn_detected", barge_in=True)


def test_a_turn_ready_while_the_reply_is_being_cancelled_waits_for_its_end() -> None:
    """Cancel during commit: the client cancels, and before the cancelled reply has ended the next turn is
    ready. It is answered once response.done is out, not refused as a second active response."""
    core, _ = make_core()
    start_reply(core, audio=False)
    assert types(core.handle(CancelRequested(None))) == ["StopResponse"]
    assert committed_turn(core, "item_u") == []
    ended = core.handle(ResponseEnded("resp_1", "cancelled", {}, reason="client_cancelled"))
    assert types(ended)[-3:] == ["response.done", "ResponseFinished", "CreateResponse"]
    assert ended[-1] == CreateResponse(ResponseParams(), turn="item_u")


def test_a_turn_ready_during_a_reply_interrupts_it_then_is_answered() -> None:
    core, _ = make_core()
    start_reply(core, audio=False)
    core.handle(SpeechBegan("item_u", audio_start_ms=0))  # interrupts (cancelling from here)
    core.handle(SpeechEnded("item_u", audio_end_ms=900))
    core.handle(TranscriptFinal("item_u", "Stop. Tell me about Rome.", audio_seconds=0.9))
    assert core.handle(TurnReady("item_u")) == []
    assert core.handle(ResponseEnded("resp_1", "cancelled", {}))[-1] == CreateResponse(ResponseParams(), turn="item_u")


def test_with_interrupt_response_off_a_turn_waits_for_the_reply_to_finish() -> None:
    core, _ = make_core(detection=TurnDetection(interrupt_response=False))
    start_reply(core, audio=False)
    assert committed_turn(core, "item_u") == []
    assert core.handle(ResponseEnded("resp_1", "completed", {}))[-1] == CreateResponse(ResponseParams(), turn="item_u")


def test_a_cancel_crossing_the_replys_end() -> None:
    core, _ = make_core()
    start_reply(core, audio=False)
    core.handle(CancelRequested("resp_1"))
    # The reply finished before its task was stopped: it ends completed, and the stop's end is ignored.
    ended = core.handle(ResponseEnded("resp_1", "completed", {}))
    assert event(ended[-2])["response"]["status"] == "completed"
    assert core.handle(ResponseEnded("resp_1", "cancelled", {})) == []
    with pytest.raises(ApiError) as refused:  # the client's next cancel finds nothing to cancel
        core.handle(CancelRequested("resp_1"))
    assert refused.value.code == "response_cancel_not_active"


def test_a_cancel_naming_another_response_is_refused_and_changes_nothing() -> None:
    core, _ = make_core()
    start_reply(core, audio=False)
    with pytest.raises(ApiError) as refused:
        core.handle(CancelRequested("resp_other"))
    assert refused.value.code == "response_cancel_not_active" and core.response is not None
    assert not core.response.cancelling


def test_refused_client_events_raise_and_change_nothing() -> None:
    core, _ = make_core(type="transcription")
    with pytest.raises(ApiError):
        core.handle(ResponseRequested(ResponseParams()))
    core, _ = make_core()
    events = start_reply(core, audio=False)
    with pytest.raises(ApiError) as in_use:
        core.handle(ItemDelete(events.item.id))
    assert in_use.value.code == "item_in_use" and len(core.conversation) == 1
    with pytest.raises(ApiError) as busy:
        core.handle(ResponseStarted(reply(core, "resp_2"), writes_conversation=True, open_message=True))
    assert busy.value.code == "conversation_already_has_active_response"


def test_a_spoken_turn_past_the_conversation_bound_is_an_error_and_listening_goes_on() -> None:
    core, _ = make_core(max_items=1)
    core.handle(ItemCreated(Item(id="item_0", type="message", role="user", content=[{"type": "input_text", "text": "hi"}])))
    core.handle(SpeechBegan("item_u", audio_start_ms=0))
    outputs = core.handle(SpeechEnded("item_u", audio_end_ms=900))
    assert types(outputs) == ["input_audio_buffer.speech_stopped", "DropTurn", "SendError"]
    assert isinstance(outputs[-1], SendError) and outputs[-1].error.code == "conversation_full"
    assert types(core.handle(SpeechBegan("item_v", audio_start_ms=1000))) == [
        "input_audio_buffer.speech_started", "PrefillDraft"]


def test_the_idle_timeout_adds_an_empty_turn_and_a_nudge() -> None:
    core, clock = make_core(detection=TurnDetection(idle_timeout_ms=5000), instructions="Be brief.")
    assert core.handle(AudioProcessed(audio_end_ms=1000)) == []
    clock.seconds += 5.0
    outputs = core.handle(AudioProcessed(audio_end_ms=6000))
    assert types(outputs) == ["input_audio_buffer.timeout_triggered", "conversation.item.added",
                              "conversation.item.done", "CreateResponse"]
    create = outputs[-1]
    assert isinstance(create, CreateResponse) and create.params.instructions is not None
    assert create.params.instructions.startswith("Be brief.\n\n") and create.turn is None
    assert core.handle(AudioProcessed(audio_end_ms=6100)) == []  # it counts again from now


def note(item_id: str) -> ReplyWhenFree:
    return ReplyWhenFree(Item(id=item_id, type="message", role="system", content=[{"type": "input_text", "text": "x"}]),
                         ResponseParams(tool_choice="none"))


def test_a_note_waits_until_nobody_speaks_then_is_said_one_at_a_time() -> None:
    """Speak when free is the core's rule, checked after every input (no loop looks at the core): a note waits
    through the reply and its playout and through the user's turn, then is added and answered; the next note
    waits for that reply in turn."""
    core, _ = make_core(playout=True)
    events = start_reply(core)
    assert core.handle(note("item_n1")) == [] and core.handle(note("item_n2")) == []
    spoken(core, events, ("Paris.", 600))
    ended = core.handle(ResponseEnded("resp_1", "completed", {}))
    assert "CreateResponse" not in types(ended) and core.playout_busy  # the reply still plays
    core.handle(SpeechBegan("item_u", audio_start_ms=0))  # the user speaks over it: still nobody free
    assert "CreateResponse" not in types(core.handle(PlayoutCleared(events.item.id, played_ms=600)))
    assert core.handle(SpeechEnded("item_u", audio_end_ms=900))[-1] == Transcribe("item_u")
    assert not core.free  # the user's words are being transcribed
    outputs = core.handle(TranscriptFinal("item_u", "", audio_seconds=0.9))  # no words: the turn gets no reply
    assert types(outputs)[-3:] == ["conversation.item.added", "conversation.item.done", "CreateResponse"]
    assert event(outputs[-3])["item"]["id"] == "item_n1"
    create = outputs[-1]
    assert isinstance(create, CreateResponse) and create.params.tool_choice == "none" and create.turn is None
    # The driver starts the commanded reply at once (ResponseStarted): the second note waits for it.
    second = start_reply(core, "resp_2")
    assert core.handle(TurnReady("item_u")) == [DropTurn("item_u")]
    assert [i.id for i in core.conversation.items][-1] == "item_resp_2"
    assert "CreateResponse" in types(core.handle(ResponseEnded(second.response_id, "completed", {})))
    assert [i.id for i in core.conversation.items][-1] == "item_n2"


def test_a_note_waits_for_a_turns_reply_that_is_queued_and_a_refused_note_is_an_error() -> None:
    core, _ = make_core(max_items=3)
    start_reply(core)
    assert DropTurn("item_u") not in committed_turn(core, "item_u")  # answered once the reply ends
    core.handle(note("item_n1"))
    ended = core.handle(ResponseEnded("resp_1", "cancelled", {}))
    assert types(ended).count("CreateResponse") == 1  # the user's turn first, the note after its reply
    assert isinstance(ended[-1], CreateResponse) and ended[-1].turn == "item_u"
    start_reply(core, "resp_2")  # the conversation is full now: reply, user, reply
    refused = core.handle(ResponseEnded("resp_2", "completed", {}))
    assert isinstance(refused[-1], SendError) and refused[-1].error.code == "conversation_full"
    assert core.free and core.handle(AudioProcessed(audio_end_ms=1000)) == []  # dropped: said once, as an error


def test_a_reply_that_only_calls_functions_never_opens_its_message() -> None:
    core, _ = make_core()
    events = reply(core, audio=False)
    assert types(core.handle(ResponseStarted(events, writes_conversation=True, open_message=False))) == [
        "response.created"]
    ended = core.handle(ResponseEnded("resp_1", "completed", {"done": 1.0}))
    assert types(ended) == ["response.done", "ResponseFinished"]
    assert isinstance(ended[-1], ResponseFinished) and ended[-1].status == "completed"
    assert event(ended[0])["response"]["metadata"] == {"gateway_latency": '{"done":1.0}'}


def test_a_reply_the_full_conversation_cannot_hold_is_refused_before_it_starts() -> None:
    core, _ = make_core(max_items=1)
    core.handle(ItemCreated(Item(id="item_0", type="message", role="user", content=[{"type": "input_text", "text": "hi"}])))
    with pytest.raises(ApiError) as full:
        core.handle(ResponseStarted(reply(core), writes_conversation=True, open_message=True))
    assert full.value.code == "conversation_full" and core.response is None
    assert types(core.handle(ResponseStarted(reply(core), writes_conversation=False, open_message=True)))[0] == (
        "response.created")


async def test_a_barge_in_while_the_client_is_away_reaches_it_on_resume_once_and_in_order() -> None:
    """Resume race: the connection drops mid-reply, the user barges in (WebRTC audio goes on without the
    data channel), then the client resumes from the last event it got, and cancels what is already over."""
    core, clock = make_core()
    outbox = Outbox(replay_bytes=1 << 20)

    def send(outputs: list[Output]) -> None:
        for output in outputs:
            if isinstance(output, Send):
                outbox.send(output.event)

    first = outbox.attach()
    events = reply(core, audio=False)
    send(core.handle(ResponseStarted(events, writes_conversation=True, open_message=True)))
    send(core.handle(TextDelta("resp_1", "Paris")))
    received = [await take(first) for _ in range(5)]
    assert [e["type"] for e in received][-1] == "response.output_text.delta"
    last_seen = received[-2]["sequence_number"]  # the delta was lost with the connection
    clock.seconds += 1
    outputs = core.handle(SpeechBegan("item_u", audio_start_ms=0))
    send(outputs)
    assert isinstance(outputs[-1], StopResponse)
    send(core.handle(ResponseEnded("resp_1", "cancelled", {}, reason="turn_detected")))
    second = outbox.attach(after=last_seen)
    resumed = []
    while outbox._queue:
        resumed.append(await take(second))
    assert [e["type"] for e in resumed] == [
        "response.output_text.delta", "input_audio_buffer.speech_started", "response.output_text.done",
        "response.content_part.done", "response.output_item.done", "conversation.item.done", "response.done"]
    assert [e["sequence_number"] for e in resumed] == list(range(last_seen + 1, last_seen + 1 + len(resumed)))
    assert resumed[-1]["response"]["status"] == "cancelled"
    with pytest.raises(ApiError) as late:
        core.handle(CancelRequested("resp_1"))
    assert late.value.code == "response_cancel_not_active"


def test_partial_transcripts_send_their_stable_words_once_and_prefill_them() -> None:
    core, _ = make_core()
    core.handle(SpeechBegan("item_u", audio_start_ms=0))
    first = core.handle(TranscriptPartial("item_u", "What is the"))
    assert [event(o)["delta"] for o in first] == [""]  # one partial: nothing agreed on yet
    second = core.handle(TranscriptPartial("item_u", "What is the capital"))
    assert types(second) == ["PrefillDraft", "conversation.item.input_audio_transcription.delta"]
    assert second[0] == PrefillDraft("item_u", "What is the")
    assert event(second[1])["delta"] == "What is the" and event(second[1])["text"] == "What is the capital"
    revised = core.handle(TranscriptPartial("item_u", "What was the capital"))  # a stable word revised
    assert types(revised) == ["conversation.item.input_audio_transcription.delta"] and event(revised[0])["delta"] == ""
    core.handle(SpeechEnded("item_u", audio_end_ms=900))
    assert core.handle(TranscriptPartial("item_u", "What was the capital of France")) == []  # the turn has ended


def test_with_transcription_off_partials_still_prefill_but_send_nothing() -> None:
    core, _ = make_core()
    core.config.audio.input.transcription = None
    core.handle(SpeechBegan("item_u", audio_start_ms=0))
    core.handle(TranscriptPartial("item_u", "Hello there"))
    assert core.handle(TranscriptPartial("item_u", "Hello there friend")) == [PrefillDraft("item_u", "Hello there")]


def test_a_turns_prefill_waits_for_the_reply_holding_the_engine() -> None:
    core, _ = make_core(detection=TurnDetection(interrupt_response=False))
    start_reply(core)
    assert types(core.handle(SpeechBegan("item_u", audio_start_ms=0))) == ["input_audio_buffer.speech_started"]
    core.handle(TranscriptPartial("item_u", "Tell me"))
    assert types(core.handle(TranscriptPartial("item_u", "Tell me more"))) == [
        "conversation.item.input_audio_transcription.delta"]
    ended = core.handle(ResponseEnded("resp_1", "completed", {}))
    assert ended[-1] == PrefillDraft("item_u", "Tell me")


def test_a_transcription_session_prefills_nothing() -> None:
    core, _ = make_core(type="transcription")
    assert types(core.handle(SpeechBegan("item_u", audio_start_ms=0))) == ["input_audio_buffer.speech_started"]


def test_semantic_vad_sets_the_silence_from_the_end_of_turn_probability() -> None:
    core, _ = make_core()
    assert core.handle(EndOfTurnJudged("item_u", None, 0.9)) == []  # server_vad: the silence is fixed
    core.config.audio.input.turn_detection = SemanticVad(type="semantic_vad", eagerness="high")
    core.handle(SpeechBegan("item_u", audio_start_ms=0))
    assert core.handle(EndOfTurnJudged("item_u", None, 0.9)) == [SetSilence("item_u", 250)]  # finished: the shortest
    assert core.handle(EndOfTurnJudged("item_u", None, 0.0)) == [SetSilence("item_u", 1000)]  # cut off: the longest
    assert core.handle(EndOfTurnJudged("item_u", 0.9, None)) == [SetSilence("item_u", 150)]  # the audio model's
    assert core.handle(EndOfTurnJudged("item_u", 0.9, 0.0)) == [SetSilence("item_u", 700)]  # cut off, sounds finished
    # Words Whisper was unsure of: finished-sounding audio alone waits a long mid-thought pause.
    assert core.handle(EndOfTurnJudged("item_u", 0.9, 0.9, words_sure=False)) == [SetSilence("item_u", 600)]
    assert core.handle(EndOfTurnJudged("item_v", 0.9, 0.9)) == []  # not the open turn
    core.handle(SpeechEnded("item_u", audio_end_ms=900))
    assert core.handle(EndOfTurnJudged("item_u", 0.9, 0.9)) == []  # the turn has ended


def test_server_vad_asks_the_audio_model_only_when_told() -> None:
    core, _ = make_core()
    core.handle(SpeechBegan("item_u", audio_start_ms=0))
    started = core.handle(SilenceHeard("item_u", silence_ms=100, speech=False, covered=False))
    assert [o for o in started if isinstance(o, StartSpeculation)][0].judge_end is False
    assert core.handle(EndOfTurnJudged("item_u", 0.1, None)) == []
    judged, _ = make_core()
    judged.judges_server_vad = True
    judged.handle(SpeechBegan("item_u", audio_start_ms=0))
    started = judged.handle(SilenceHeard("item_u", silence_ms=100, speech=False, covered=False))
    assert [o for o in started if isinstance(o, StartSpeculation)][0].judge_end is True
    assert judged.handle(EndOfTurnJudged("item_u", 0.1, None)) == [SetSilence("item_u", 2000)]  # unfinished: longer
    assert judged.handle(EndOfTurnJudged("item_u", 0.9, None)) == [SetSilence("item_u", 400)]  # the session's own


def test_a_silence_long_enough_starts_the_speculative_transcript_and_the_reply_ahead_once() -> None:
    core, _ = make_core()
    core.handle(SpeechBegan("item_u", audio_start_ms=0))
    assert core.handle(SilenceHeard("item_u", silence_ms=None, speech=True, covered=False)) == []
    assert core.handle(SilenceHeard("item_u", silence_ms=32, speech=False, covered=False)) == []  # a soft word ending
    started = StartSpeculation("item_u", preempt=True, judge_end=False)
    assert core.handle(SilenceHeard("item_u", silence_ms=64, speech=False, covered=False)) == [started]
    assert core.handle(SilenceHeard("item_u", silence_ms=96, speech=False, covered=False)) == []  # already running
    assert core.handle(SilenceHeard("item_v", silence_ms=96, speech=False, covered=False)) == []  # not the open turn


def test_no_speculative_transcript_while_a_running_one_reaches_the_end_of_the_audio() -> None:
    core, _ = make_core()
    core.handle(SpeechBegan("item_u", audio_start_ms=0))
    assert core.handle(SilenceHeard("item_u", silence_ms=64, speech=False, covered=True)) == []
    assert core.handle(SilenceHeard("item_u", silence_ms=96, speech=False, covered=False)) == [
        StartSpeculation("item_u", preempt=True, judge_end=False)]


def test_speech_again_discards_the_speculation_and_the_next_silence_starts_another() -> None:
    core, _ = make_core()
    core.handle(SpeechBegan("item_u", audio_start_ms=0))
    assert core.handle(SilenceHeard("item_u", silence_ms=None, speech=True, covered=False)) == []  # nothing to discard
    core.handle(SilenceHeard("item_u", silence_ms=64, speech=False, covered=False))
    assert core.handle(SilenceHeard("item_u", silence_ms=None, speech=False, covered=False)) == []  # not speech yet
    assert core.handle(SilenceHeard("item_u", silence_ms=None, speech=True, covered=False)) == [
        DiscardSpeculation("item_u")]
    assert core.handle(SilenceHeard("item_u", silence_ms=None, speech=True, covered=False)) == []
    assert core.handle(SilenceHeard("item_u", silence_ms=64, speech=False, covered=False)) == [
        StartSpeculation("item_u", preempt=True, judge_end=False)]


def test_the_committed_turn_keeps_its_speculation_and_its_reply_takes_it() -> None:
    """The turn ends in the silence that started it: nothing is discarded, and its reply (CreateResponse) takes the
    head start; a turn that gets no reply releases it (DropTurn)."""
    core, _ = make_core()
    core.handle(SpeechBegan("item_u", audio_start_ms=0))
    core.handle(SilenceHeard("item_u", silence_ms=64, speech=False, covered=False))
    ended = core.handle(SpeechEnded("item_u", audio_end_ms=900))
    assert not any(isinstance(output, DiscardSpeculation) for output in ended) and ended[-1] == Transcribe("item_u")
    assert core.handle(SilenceHeard("item_u", silence_ms=None, speech=True, covered=False)) == []  # the turn is over
    core.handle(TranscriptFinal("item_u", "What is the capital of France?", audio_seconds=0.9))
    assert core.handle(TurnReady("item_u")) == [CreateResponse(ResponseParams(), turn="item_u")]


def test_the_reply_ahead_follows_the_preemption_setting_and_create_response() -> None:
    core, _ = make_core()
    core.preempts = False
    core.handle(SpeechBegan("item_u", audio_start_ms=0))
    assert core.handle(SilenceHeard("item_u", silence_ms=64, speech=False, covered=False)) == [
        StartSpeculation("item_u", preempt=False, judge_end=False)]  # the transcript still runs ahead
    core, _ = make_core(detection=TurnDetection(create_response=False))
    core.handle(SpeechBegan("item_u", audio_start_ms=0))
    assert core.handle(SilenceHeard("item_u", silence_ms=64, speech=False, covered=False)) == [
        StartSpeculation("item_u", preempt=False, judge_end=False)]


def test_semantic_vad_judges_the_end_of_turn_from_the_speculative_transcript() -> None:
    core, _ = make_core(detection=SemanticVad(type="semantic_vad"))
    core.handle(SpeechBegan("item_u", audio_start_ms=0))
    assert core.handle(SilenceHeard("item_u", silence_ms=64, speech=False, covered=False)) == [
        StartSpeculation("item_u", preempt=True, judge_end=True)]


def test_no_speculation_without_an_open_turn() -> None:
    core, _ = make_core()
    assert core.handle(SilenceHeard("item_u", silence_ms=64, speech=False, covered=False)) == []
    core.handle(SpeechBegan("item_u", audio_start_ms=0))
    core.handle(AudioCommitted("item_u"))  # a commit ends the turn (the driver drops what it had started)
    assert core.handle(SilenceHeard("item_u", silence_ms=64, speech=False, covered=False)) == []
    core.handle(SpeechBegan("item_v", audio_start_ms=1000))
    assert core.handle(SilenceHeard("item_u", silence_ms=64, speech=False, covered=False)) == []  # not the open turn


def test_a_reply_in_progress_does_not_stop_the_speculation() -> None:
    """With interrupt_response off the reply goes on while the user speaks: the transcript still runs ahead, and
    the reply ahead is asked for (preempt_reply starts none while a response holds the engine, when it gets there)."""
    core, _ = make_core(detection=TurnDetection(interrupt_response=False))
    start_reply(core)
    core.handle(SpeechBegan("item_u", audio_start_ms=0))
    assert core.handle(SilenceHeard("item_u", silence_ms=64, speech=False, covered=False)) == [
        StartSpeculation("item_u", preempt=True, judge_end=False)]
