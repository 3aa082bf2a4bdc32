"""The multi-voice turn-taking set (benchmarks/turn_taking_set.py) and the pure parts of the WebRTC overlap
benchmark (benchmarks/overlap.py): their structure, with no model."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.overlap import longest_silence_s, reply_stopped
from benchmarks.turn_taking_set import PAUSES_MS, RATE, TRAIL_S, build, recordings
from benchmarks.voice_audio import speech_span
from benchmarks.voices import EspeakSpeaker, espeak_available


@pytest.mark.skipif(not espeak_available(), reason="espeak-ng is not installed (.ci/run installs it)")
def test_an_espeak_voice_speaks_every_kind_with_its_pauses_where_they_are_said() -> None:
    voice = EspeakSpeaker("en-gb-scotland", 200)
    utterances = build(voice, seed=1)
    assert {u.kind for u in utterances} == {"complete", "paused", "backchannel", "interruption", "noisy"}
    assert {u.voice for u in utterances} == {voice.name}
    for u in utterances:
        assert u.pcm.dtype == np.int16
        assert len(u.pcm) - u.speech_end == pytest.approx(TRAIL_S * RATE, abs=RATE // 50)
        if u.kind != "noisy":
            assert not u.pcm[u.speech_end:].any()  # silence after the speech
    for i, u in enumerate(u for u in utterances if u.kind == "paused"):
        assert u.pause is not None
        start, end = u.pause
        assert end - start == RATE * PAUSES_MS[i % len(PAUSES_MS)] // 1000
        assert not u.pcm[start:end].any()
        before, after = speech_span(u.pcm[:start], RATE), speech_span(u.pcm[end:], RATE)
        assert before[1] > before[0] and after[1] > after[0]  # words on both sides of the pause


def test_the_human_recordings_are_complete_utterances_each_voice_its_own() -> None:
    utterances, missing = recordings()
    for u in utterances:
        assert u.kind in ("complete", "noisy") and u.voice.startswith("human:") and u.text
        assert speech_span(u.pcm[:u.speech_end], RATE)[1] > 0
    assert len({u.voice for u in utterances}) + len(missing) == 2


def test_the_overlap_benchmark_reads_a_stopped_reply_and_a_held_one() -> None:
    frames = [(0.02 * i, 1000.0 if not 10 <= i < 30 else 5.0) for i in range(60)]  # 20 silent frames at 0.2 s
    assert longest_silence_s(frames, 0.0, 2.0) == pytest.approx(0.4)
    assert longest_silence_s(frames, 0.5, 2.0) == pytest.approx(0.1)  # only what falls in the window
    done = {"type": "response.done", "response": {"id": "resp_1", "status": "cancelled"}}
    assert reply_stopped([done], "resp_1") and not reply_stopped([done], "resp_2")
    assert reply_stopped([{"type": "output_audio_buffer.cleared"}], "resp_1")
    assert not reply_stopped([{"type": "conversation.item.deleted"}], "resp_1")
