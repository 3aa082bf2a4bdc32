import numpy as np
import pytest

from media.resample import Resampler, downmix, resample


def sine(freq: float, rate: int, seconds: float, amp: float = 10000) -> np.ndarray:
    t = np.arange(int(rate * seconds)) / rate
    return (np.sin(2 * np.pi * freq * t) * amp).astype(np.int16)


def dominant_frequency(pcm: np.ndarray, rate: int) -> float:
    spectrum = np.abs(np.fft.rfft(pcm.astype(np.float64) * np.hanning(pcm.size)))
    return float(np.fft.rfftfreq(pcm.size, 1 / rate)[np.argmax(spectrum)])


@pytest.mark.parametrize("in_rate,out_rate", [(22050, 48000), (48000, 16000), (24000, 16000), (16000, 24000), (8000, 16000)])
def test_one_shot_length_and_pitch(in_rate: int, out_rate: int) -> None:
    out = resample(sine(440, in_rate, 1.0), in_rate, out_rate)
    assert out.dtype == np.int16
    assert abs(out.size - out_rate) <= 2
    assert dominant_frequency(out, out_rate) == pytest.approx(440, abs=2)


@pytest.mark.parametrize("quality", ["HQ", "LQ"])
def test_streaming_matches_length_and_pitch(quality: str) -> None:
    src = sine(1000, 48000, 1.0)
    r = Resampler(48000, 16000, quality=quality)
    parts = [r.process(src[i : i + 960]) for i in range(0, src.size, 960)]
    out = np.concatenate(parts + [r.flush()])
    assert abs(out.size - 16000) <= 2
    assert dominant_frequency(out[1000:], 16000) == pytest.approx(1000, abs=2)
    # Streaming keeps the filter state across chunks: no discontinuity at chunk edges.
    steady = out[2000:-2000].astype(np.float64)
    expected_step = 2 * np.sin(np.pi * 1000 / 16000) * 10000
    assert np.max(np.abs(np.diff(steady))) < expected_step * 1.1


def test_stereo_is_downmixed() -> None:
    left = sine(440, 48000, 0.5)
    interleaved = np.stack([left, left], axis=1).reshape(1, -1)  # aiortc's packed s16 layout
    r = Resampler(48000, 16000, channels_in=2)
    out = np.concatenate([r.process(interleaved), r.flush()])
    assert abs(out.size - 8000) <= 2
    assert dominant_frequency(out, 16000) == pytest.approx(440, abs=3)


def test_downmix_averages_channels_in_any_layout() -> None:
    packed = np.array([[100, 300, -100, -300]], dtype=np.int16)
    assert downmix(packed, 2).tolist() == [200, -200]
    planar = np.array([[100, -100, 7], [300, -300, 7]], dtype=np.int16)
    assert downmix(planar, 2).tolist() == [200, -200, 7]


def test_same_rate_passes_through() -> None:
    src = sine(440, 16000, 0.1)
    r = Resampler(16000, 16000)
    assert np.array_equal(r.process(src), src)
    assert r.flush().size == 0
