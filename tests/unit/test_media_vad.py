import numpy as np
import pytest

from media.frames import AudioChunk
from media.vad import (
    WINDOW_MS,
    WINDOW_SAMPLES,
    StreamingVad,
    TurnDetector,
    VadSettings,
    VadSpeechStarted,
    VadSpeechStopped,
)

W = WINDOW_MS  # 32 ms


def run(detector: TurnDetector, probs: list[float], start_window: int = 0) -> list[object]:
    events: list[object] = []
    for i, p in enumerate(probs, start=start_window + 1):
        events += detector.feed(p, i * W)
    return events


def test_speech_then_silence_gives_one_turn_with_onset_and_end() -> None:
    d = TurnDetector(VadSettings(silence_duration_ms=500, min_speech_ms=100, prefix_padding_ms=300))
    probs = [0.0] * 20 + [0.9] * 30 + [0.0] * 20
    events = run(d, probs)
    assert events == [
        VadSpeechStarted(audio_start_ms=round(20 * W), padded_start_ms=round(20 * W - 300), detected_ms=round(24 * W)),
        VadSpeechStopped(audio_end_ms=round(50 * W), detected_ms=round(66 * W)),
    ]
    assert not d.in_speech


def test_click_shorter_than_min_speech_is_ignored() -> None:
    d = TurnDetector(VadSettings(min_speech_ms=100))
    assert run(d, [0.0] * 5 + [0.95] * 3 + [0.0] * 30) == []  # 96 ms of "speech"


def test_speech_started_waits_for_min_speech() -> None:
    d = TurnDetector(VadSettings(min_speech_ms=160))
    events = run(d, [0.9] * 4)
    assert events == []
    assert run(d, [0.9], start_window=4) == [VadSpeechStarted(0, 0, round(5 * W))]


def test_hysteresis_keeps_speech_between_the_two_thresholds() -> None:
    d = TurnDetector(VadSettings(threshold=0.5, silence_duration_ms=200))
    # 0.4 is under threshold but over threshold - 0.15: it neither starts speech...
    assert run(d, [0.4] * 10) == []
    # ...nor ends it.
    events = run(d, [0.8] * 5 + [0.4] * 20, start_window=10)
    assert [type(e) for e in events] == [VadSpeechStarted]
    events = run(d, [0.1] * 7, start_window=35)
    assert events == [VadSpeechStopped(audio_end_ms=round(35 * W), detected_ms=round(42 * W))]


def test_pause_shorter_than_silence_duration_does_not_end_the_turn() -> None:
    d = TurnDetector(VadSettings(silence_duration_ms=500))
    probs = [0.9] * 10 + [0.0] * 12 + [0.9] * 10 + [0.0] * 16  # 384 ms pause, then 512 ms silence
    events = run(d, probs)
    assert [type(e) for e in events] == [VadSpeechStarted, VadSpeechStopped]
    assert events[1] == VadSpeechStopped(audio_end_ms=round(32 * W), detected_ms=round(48 * W))


def test_mid_probability_does_not_reset_a_running_silence() -> None:
    d = TurnDetector(VadSettings(silence_duration_ms=320))
    events = run(d, [0.9] * 10 + [0.1] * 5 + [0.45] * 5 + [0.1])
    assert events[-1] == VadSpeechStopped(audio_end_ms=round(10 * W), detected_ms=round(20 * W))


def test_silence_started_is_known_while_a_turn_waits_it_out() -> None:
    d = TurnDetector(VadSettings(silence_duration_ms=320))
    run(d, [0.9] * 10)
    assert d.silence_started_ms is None
    run(d, [0.1, 0.1], start_window=10)
    assert d.silence_started_ms == 10 * W  # the start of the first silent window
    run(d, [0.9], start_window=12)
    assert d.silence_started_ms is None  # speech again
    run(d, [0.1] * 10, start_window=13)  # 320 ms: the turn ends
    assert d.silence_started_ms is None and not d.in_speech


def test_prefix_padding_is_clamped_at_zero_and_configurable() -> None:
    d = TurnDetector(VadSettings(prefix_padding_ms=300))
    assert run(d, [0.9] * 5)[0].padded_start_ms == 0
    d = TurnDetector(VadSettings(prefix_padding_ms=100))
    started = run(d, [0.0] * 10 + [0.9] * 5)[0]
    assert started.audio_start_ms - started.padded_start_ms == 100


def test_reset_forgets_a_turn_in_progress() -> None:
    d = TurnDetector()
    run(d, [0.9] * 10)
    assert d.in_speech
    d.reset()
    assert not d.in_speech
    assert run(d, [0.0] * 30, start_window=10) == []


def test_settings_validation() -> None:
    with pytest.raises(ValueError):
        VadSettings(threshold=1.5)
    with pytest.raises(ValueError):
        VadSettings(silence_duration_ms=-1)
    assert VadSettings(threshold=0.1).continue_threshold == pytest.approx(0.01)


class ScriptedModel:
    """Speech probability = 1 when the window's mean level is high: stands in for Silero."""

    def __init__(self) -> None:
        self.windows = 0
        self.resets = 0

    def probability(self, window: np.ndarray) -> float:
        assert window.shape == (WINDOW_SAMPLES,) and window.dtype == np.float32
        self.windows += 1
        return 1.0 if np.abs(window).mean() > 0.1 else 0.0

    def reset(self) -> None:
        self.resets += 1


def test_streaming_vad_buffers_odd_chunks_and_keeps_the_stream_clock() -> None:
    audio = np.concatenate([np.zeros(16000), np.full(16000, 10000), np.zeros(16000)]).astype(np.int16)
    model = ScriptedModel()
    vad = StreamingVad(model, VadSettings(silence_duration_ms=300))
    events = []
    for i in range(0, audio.size, 333):  # chunk size unrelated to the window
        events += vad.process(AudioChunk(audio[i : i + 333], 16000))
    assert model.windows == audio.size // WINDOW_SAMPLES
    assert vad.position_ms == pytest.approx(model.windows * W)
    started, stopped = events
    assert isinstance(started, VadSpeechStarted) and isinstance(stopped, VadSpeechStopped)
    assert abs(started.audio_start_ms - 1000) <= W
    assert abs(stopped.audio_end_ms - 2000) <= W


def test_streaming_vad_reset_restarts_the_clock() -> None:
    model = ScriptedModel()
    vad = StreamingVad(model)
    vad.process(AudioChunk(np.zeros(1000, dtype=np.int16), 16000))
    vad.reset(start_ms=5000)
    assert model.resets == 1 and vad.position_ms == 5000
    vad.process(AudioChunk(np.zeros(512, dtype=np.int16), 16000))
    assert vad.position_ms == pytest.approx(5000 + W)


def test_streaming_vad_refuses_other_rates() -> None:
    with pytest.raises(ValueError):
        StreamingVad(ScriptedModel()).process(AudioChunk.silence(20, 48000))


def test_voiced_time_counts_the_speech_windows_not_the_silences_between() -> None:
    """A backchannel's length over a paused reply (barge_in.py): a short word is short whatever silence the turn
    then waits for (semantic_vad may wait seconds)."""
    d = TurnDetector(VadSettings(silence_duration_ms=5000, min_speech_ms=64))
    run(d, [0.0] * 5 + [0.9] * 8 + [0.1] * 40)
    assert d.in_speech and d.voiced_ms == pytest.approx(8 * W)
    run(d, [0.9] * 3 + [0.4] * 2, start_window=53)  # speech again, then between the thresholds: speech goes on
    assert d.voiced_ms == pytest.approx(13 * W)
    run(d, [0.1] * 2 + [0.4] * 2, start_window=58)  # between the thresholds once a silence runs: not speech
    assert d.voiced_ms == pytest.approx(13 * W)
    d.reset()
    assert d.voiced_ms == 0.0
    run(d, [0.9, 0.0])  # a click that never became a turn
    assert d.voiced_ms == 0.0
