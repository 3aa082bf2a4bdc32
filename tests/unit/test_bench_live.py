"""--mode live's bookkeeping: answers marked from a Live session's audio, as SpokenTurn folds Realtime's events."""

from __future__ import annotations

import base64

import numpy as np

from gateway.bench.live import ANSWER_GAP_S, CUT_S, LiveAnswers
from gateway.bench.stats import TurnRecord
from gateway.bench.voice import VOICE_RATE, AudioIn, SpokenTurn, Utterance


def audio(seconds: float) -> dict[str, str]:
    pcm = np.zeros(int(VOICE_RATE * seconds), np.int16)
    return {"type": "session.output_audio.delta", "delta": base64.b64encode(pcm.tobytes()).decode()}


def test_an_answer_starts_with_its_first_audio_and_ends_after_a_silence() -> None:
    answers = LiveAnswers()
    first = answers.heard(10.0, audio(0.02))
    assert [item["type"] for _, item in first[:2]] == ["response.created", "response.done"]  # type: ignore[index]
    assert isinstance(first[2][1], AudioIn) and first[2][1].response_id == "live_answer_1"
    assert answers.heard(10.02, audio(0.02))[0][1].response_id == "live_answer_1"  # type: ignore[union-attr]
    assert answers.watch(10.02 + ANSWER_GAP_S / 2, speaking=False) == []
    assert answers.watch(10.02 + ANSWER_GAP_S, speaking=False) == [] and answers.answer is None
    assert answers.heard(20.0, audio(0.02))[0][1]["response"]["id"] == "live_answer_2"  # type: ignore[index]
    assert answers.heard(20.0, {"type": "session.output_transcript.delta", "delta": "x"}) == []


def test_an_answer_that_stops_while_the_microphone_speaks_was_cut_at_its_last_audio() -> None:
    answers = LiveAnswers()
    answers.heard(1.0, audio(0.02))
    answers.heard(1.5, audio(0.02))
    assert answers.watch(1.5 + CUT_S + 0.01, speaking=False) == []  # a pause with nobody talking is not a cut
    [(at, cleared)] = answers.watch(1.5 + CUT_S + 0.01, speaking=True)
    assert at == 1.5 and cleared == {"type": "output_audio_buffer.cleared", "response_id": "live_answer_1"}
    assert answers.watch(1.6 + CUT_S, speaking=True) == []  # said once


def test_a_spoken_turn_measures_voice_to_voice_and_the_barge_in_from_live_events() -> None:
    question = Utterance(onset=0.0, end=2.0, speech_end=2.0)
    turn = SpokenTurn(TurnRecord(session=0, turn=0, started_at=0.0), question, plays_out=True, barge_in_after_s=0.3)
    answers = LiveAnswers()
    for received in answers.heard(2.4, audio(0.02)) + answers.heard(2.8, audio(0.02)):
        turn.feed(*received)
    turn.interrupted(Utterance(onset=2.7))
    for received in answers.watch(2.8 + CUT_S + 0.01, speaking=True):
        turn.feed(*received)
    turn.measure(None)
    assert turn.record.voice_to_voice_ms == 400.0
    assert turn.record.barge_in_ms == 100.0 and not turn.record.barge_in_missed
