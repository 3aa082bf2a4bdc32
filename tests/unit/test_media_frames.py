import numpy as np
import pytest

from media.frames import AudioChunk, float_to_int16


def test_duration_and_samples() -> None:
    chunk = AudioChunk(np.zeros(320, dtype=np.int16), 16000)
    assert chunk.samples == 320
    assert chunk.duration_ms == pytest.approx(20.0)


def test_silence() -> None:
    chunk = AudioChunk.silence(20, 48000)
    assert chunk.samples == 960 and not chunk.pcm.any()


def test_float_conversion_round_trips() -> None:
    pcm = np.array([0, 16384, -32768, 32767], dtype=np.int16)
    f = AudioChunk(pcm, 16000).to_float32()
    assert f.dtype == np.float32 and f.tolist()[:3] == [0.0, 0.5, -1.0]
    assert np.array_equal(float_to_int16(f), pcm)


def test_float_to_int16_clips_overshoot() -> None:
    assert float_to_int16(np.array([1.5, -1.5], dtype=np.float32)).tolist() == [32767, -32768]


def test_rejects_non_int16() -> None:
    with pytest.raises(ValueError):
        AudioChunk(np.zeros(10, dtype=np.float32), 16000)
