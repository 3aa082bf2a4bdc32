"""The bench's spoken turns without a server (gateway/bench/voice.py): the microphone's queue and timing, a
turn's bookkeeping fed what a WebSocket or a WebRTC call delivers, barge-in included, a session's event log, and
which response a WebRTC caller hears (webrtc.py's Playback)."""

from __future__ import annotations

import numpy as np

from gateway.bench.stats import TurnRecord
from gateway.bench.voice import QUIET_S, AudioIn, Microphone, SessionLog, SpokenTurn, Utterance, playback_stall_ms
from gateway.bench.webrtc import TAIL_S, Playback

RATE = 1000  # 20 samples a chunk


def speech(samples: int, level: int = 5000) -> np.ndarray:
    return np.full(samples, level, np.int16)


def test_the_microphone_times_the_onset_and_the_end_of_each_clip() -> None:
    mic = Microphone(RATE, tail_s=0.03)
    clip = np.concatenate([np.zeros(25, np.int16), speech(20)])  # speech starts in the second chunk
    said = mic.say(clip)
    chunks = []
    at = 0.0
    while (chunk := mic.take(at)) is not None:
        chunks.append(chunk)
        at += 0.02
    assert [len(chunk) for chunk in chunks] == [20] * 4  # 45 samples of clip + 30 of silence, padded
    assert said.onset == 0.02 and said.end == 0.04
    assert np.array_equal(np.concatenate(chunks)[:45], clip) and not np.concatenate(chunks)[45:].any()
    assert not mic.pending


def test_an_interruption_takes_the_place_of_queued_silence_but_not_of_queued_speech() -> None:
    mic = Microphone(RATE, tail_s=1.0)
    first = mic.say(speech(20))
    mic.take(0.0)  # the first clip's only chunk: its silence is queued now
    second = mic.say(speech(20, level=-7000))
    assert np.array_equal(mic.take(0.02), speech(20, level=-7000))  # straight after, no silence between
    assert first.end == 0.0 and second.onset == second.end == 0.02
    third = mic.say(speech(10))
    fourth = mic.say(speech(10))  # speech queued before it goes first
    assert np.array_equal(mic.take(0.04), speech(20)) and third.end == fourth.end == 0.04
    mic.clear()
    assert not mic.pending and mic.take(0.06) is None


def test_quiet_audio_has_no_onset() -> None:
    mic = Microphone(RATE, tail_s=0)
    said = mic.say(np.full(20, 100, np.int16))
    mic.take(1.0)
    assert said.onset is None and said.end == 1.0


def created(response_id: str) -> dict:
    return {"type": "response.created", "response": {"id": response_id}}


def done(response_id: str, status: str = "completed") -> dict:
    return {"type": "response.done", "response": {"id": response_id, "status": status}}


def test_a_websocket_turn_is_timed_from_the_end_of_speech() -> None:
    record = TurnRecord(session=0, turn=0, started_at=0)
    question = Utterance(onset=0.5, end=2.0)
    turn = SpokenTurn(record, question, plays_out=False, barge_in_after_s=None)
    turn.feed(2.4, created("r1"))
    turn.feed(2.5, {"type": "response.output_audio_transcript.delta", "response_id": "r1", "delta": "Hi"})
    turn.feed(2.6, AudioIn(1.0, "r1"))
    turn.feed(2.7, AudioIn(1.0, "r1"))
    assert not turn.finished(2.8)
    turn.feed(2.8, done("r1"))
    assert turn.finished(2.8) and turn.interrupt_at is None
    turn.measure(clock=None)
    assert (record.ttft_ms, record.voice_to_voice_ms, record.total_ms) == (500.0, 600.0, 800.0)
    assert record.audio_rtf == 0.05 and record.output_tokens == 1 and record.barge_in_ms is None
    assert not record.barge_in_missed
    assert record.audio_stall_ms == 0.0  # the second second came while the first played


def test_a_listener_hears_the_silence_of_audio_that_came_after_the_audio_before_it_played_out() -> None:
    # 1 s at 0 (plays to 1.0), 1 s at 0.5 (to 2.0), 0.5 s at 3.0: a 1 s gap; 1 s at 3.2 (to 4.5), 1 s at 4.6.
    assert playback_stall_ms({0.0: 1.0, 0.5: 1.0, 3.0: 0.5, 3.2: 1.0, 4.6: 1.0}) == 1100.0
    assert playback_stall_ms({2.0: 3.0, 2.1: 0.2, 4.9: 1.0}) == 0.0
    assert playback_stall_ms({}) == 0.0


def test_a_websocket_barge_in_lasts_until_the_server_ends_the_answer() -> None:
    record = TurnRecord(session=0, turn=0, started_at=0)
    turn = SpokenTurn(record, Utterance(0.5, 2.0), plays_out=False, barge_in_after_s=0.3)
    turn.feed(2.4, created("r1"))
    turn.feed(2.6, AudioIn(3.0, "r1"))  # a whole clause at once
    assert turn.interrupt_at == 2.6 + 0.3 and not turn.interrupt_due(2.8) and turn.interrupt_due(2.9)
    interruption = Utterance()
    turn.interrupted(interruption)
    interruption.onset = 2.92
    turn.feed(3.1, {"type": "response.output_audio_transcript.delta", "response_id": "r1", "delta": "more"})
    turn.feed(3.2, done("r1", "cancelled"))
    assert not turn.finished(3.2)  # the reply to the interruption is still to come
    turn.feed(4.5, created("r2"))
    turn.feed(4.6, {"type": "response.output_audio_transcript.delta", "response_id": "r2", "delta": "Yes"})
    turn.feed(4.7, AudioIn(1.0, "r2"))
    turn.feed(5.0, done("r2"))
    assert turn.finished(5.0)
    turn.measure(clock=None)
    assert record.barge_in_ms == 280.0 and not record.barge_in_missed  # 2.92 -> 3.2
    assert record.ttft_ms == 1100.0 and record.output_tokens == 1  # the answer's delta, not the reply's
    assert record.total_ms == 1200.0


def test_an_answer_over_before_the_interruption_is_a_missed_barge_in() -> None:
    record = TurnRecord(session=0, turn=0, started_at=0)
    turn = SpokenTurn(record, Utterance(0.5, 2.0), plays_out=False, barge_in_after_s=0.3)
    turn.feed(2.4, created("r1"))
    turn.feed(2.6, AudioIn(1.0, "r1"))
    turn.feed(2.7, done("r1"))
    assert turn.finished(2.7) and turn.interruption is None
    turn.measure(clock=None)
    assert record.barge_in_ms is None and record.barge_in_missed


def test_a_webrtc_turn_waits_for_the_playout_and_times_the_last_loud_frame_of_the_interrupted_answer() -> None:
    record = TurnRecord(session=0, turn=0, started_at=0)
    turn = SpokenTurn(record, Utterance(0.5, 2.0), plays_out=True, barge_in_after_s=0.3)
    turn.feed(1.0, AudioIn(0.02, None))  # before any response of this turn: nobody's
    turn.feed(2.4, created("r1"))
    turn.feed(2.5, done("r1"))  # generated, but it plays at real-time pace
    assert not turn.finished(2.5)
    for index in range(20):
        turn.feed(2.6 + index * 0.02, AudioIn(0.02, None))
    assert turn.interrupt_due(2.9)
    interruption = Utterance(onset=2.92)
    turn.interrupted(interruption)
    turn.feed(3.05, {"type": "output_audio_buffer.cleared", "response_id": "r1"})
    turn.feed(4.5, created("r2"))
    turn.feed(4.7, AudioIn(0.02, None))  # the reply's
    turn.feed(4.8, done("r2"))
    assert not turn.finished(4.8) and turn.wake_at(4.8, deadline=100) == 4.8 + 0.05
    turn.feed(6.0, {"type": "output_audio_buffer.stopped", "response_id": "r2"})
    assert turn.finished(6.0)
    turn.measure(clock=None)
    assert record.voice_to_voice_ms == 600.0 and record.audio_rtf is None
    assert record.barge_in_ms == 60.0  # 2.92 -> the answer's last loud frame at 2.98


def test_a_webrtc_response_without_a_playout_event_is_over_once_quiet() -> None:
    turn = SpokenTurn(TurnRecord(session=0, turn=0, started_at=0), Utterance(0.5, 2.0), plays_out=True,
                      barge_in_after_s=None)
    turn.feed(2.4, created("r1"))
    turn.feed(2.5, AudioIn(0.02, None))
    turn.feed(2.6, done("r1"))
    assert not turn.finished(2.6 + QUIET_S - 0.01) and turn.finished(2.6 + QUIET_S)


def test_an_always_on_microphone_places_the_end_of_speech_within_its_chunk_and_in_the_stream() -> None:
    mic = Microphone(RATE, tail_s=0, always_on=True)
    assert not mic.take(0.0).any()  # nothing to say: silence, which counts in the stream
    said = mic.say(speech(30), speech=(5, 25))  # its speech: samples 5 to 24
    mic.take(0.02)
    assert said.onset == 0.02 and said.stream_onset_ms == 25.0 and said.speech_end is None
    mic.take(0.04, lag_ms=3.0)
    assert said.end == 0.04 and said.speech_end == 0.04 - 0.015  # sample 25 is the chunk's 6th of 20
    assert said.stream_speech_end_ms == 45.0 and said.end_lag_ms == 3.0
    assert not mic.pending and not mic.take(0.06).any()


def test_the_session_log_folds_responses_and_input_audio_marks() -> None:
    log = SessionLog()
    log.feed(1.0, {"type": "input_audio_buffer.speech_started", "audio_start_ms": 100})
    log.feed(1.5, {"type": "conversation.item.input_audio_transcription.completed", "transcript": "Hi"})
    heard = log.feed(2.0, created("r1"))
    assert heard is not None and heard.created == 2.0 and log.order == [heard]
    log.feed(2.1, {"type": "response.output_audio_transcript.delta", "response_id": "r1", "delta": "Hello"})
    log.feed(2.2, AudioIn(0.5, "r1"))
    log.feed(2.3, AudioIn(0.25, None))  # the latest response's
    log.feed(2.4, {"type": "error", "error": {"code": "x"}})
    done_event = done("r1", "cancelled")
    done_event["response"]["status_details"] = {"reason": "turn_detected"}
    assert log.feed(2.5, done_event) is heard
    assert (heard.text, heard.first_audio, heard.last_audio, heard.audio_s) == ("Hello", 2.2, 2.3, 0.75)
    assert heard.audio_at == {2.2: 0.5, 2.3: 0.25} and (heard.status, heard.reason) == ("cancelled", "turn_detected")
    assert [at for at, _ in log.speech_started] == [1.0] and log.transcripts == [(1.5, "Hi")]
    assert log.errors == [{"code": "x"}] and log.feed(2.6, AudioIn(0.1, "unknown")) is None


def test_playback_gives_loud_frames_to_the_oldest_response_playing_and_holds_its_done_until_heard() -> None:
    playback = Playback()
    assert playback.frame(0.5, 0.02, loud=True) == [] and playback.stray_loud_s == 0.02  # nobody's
    playback.event(1.0, created("r1"))
    marked = done("r1")
    marked["response"]["metadata"] = {"gateway_latency": '{"first_audio_ms": 300}'}
    assert playback.event(1.2, marked) == []  # generated, not yet heard
    assert playback.frame(1.3, 0.02, loud=True) == [(1.3, AudioIn(0.02, "r1"))]
    stopped = {"type": "output_audio_buffer.stopped", "response_id": "r1"}
    assert playback.event(2.0, stopped) == [(2.0, stopped), (1.2, marked)]
    playback.event(2.1, created("r2"))
    assert playback.frame(2.2, 0.02, loud=True) == [(2.2, AudioIn(0.02, "r1"))]  # still in flight
    assert playback.frame(2.2 + TAIL_S, 0.02, loud=True) == [(2.2 + TAIL_S, AudioIn(0.02, "r2"))]
    silent = done("r3")
    playback.event(3.0, created("r3"))
    assert playback.event(3.1, silent) == [(3.1, silent)]  # no audio went to the playout: handed on at once


def test_a_listening_session_s_turn_lasts_until_its_answer_would_have_played_out() -> None:
    turn = SpokenTurn(TurnRecord(session=0, turn=0, started_at=0), Utterance(onset=0.5, end=2.0), plays_out=False,
                      barge_in_after_s=None, listens=True)
    turn.feed(2.4, created("r1"))
    turn.feed(2.6, AudioIn(1.0, "r1"))
    turn.feed(2.7, AudioIn(1.0, "r1"))
    turn.feed(2.8, done("r1"))
    assert not turn.finished(2.8) and not turn.finished(4.5)  # the second second plays until 4.6
    assert turn.finished(4.6)
    assert turn.wake_at(2.8, 100.0) < 2.9  # it looks again soon, not at the turn's deadline
    silent = SpokenTurn(TurnRecord(session=0, turn=1, started_at=0), Utterance(onset=0.5, end=2.0), plays_out=False,
                        barge_in_after_s=None, listens=True)
    silent.feed(2.4, created("r2"))
    silent.feed(2.8, done("r2"))
    assert silent.finished(2.8)  # an answer without audio (a failed one) is not waited for
