"""Sample-rate conversion with soxr: streaming (state kept across chunks, no clicks at chunk edges) and one-shot."""

from __future__ import annotations

from typing import Literal

import numpy as np
import soxr

# soxr quality names. "HQ" delays a stream by ~20-60 ms (it works in blocks); "LQ" by ~6 ms and emits
# steadily, which suits live input where turn timing matters more than the last bit of passband.
Quality = Literal["QQ", "LQ", "MQ", "HQ", "VHQ"]


def downmix(pcm: np.ndarray, channels: int) -> np.ndarray:
    """Interleaved (n*channels,) or (n, channels) or planar (channels, n) int16 to mono int16."""
    if channels == 1:
        return np.asarray(pcm, dtype=np.int16).reshape(-1)
    frames = np.asarray(pcm)
    if frames.ndim == 2 and frames.shape[0] == channels and frames.shape[1] != channels:
        frames = frames.T
    frames = frames.reshape(-1, channels).astype(np.int32)
    return (frames.sum(axis=1) // channels).astype(np.int16)


class Resampler:
    """Streaming resampler for one audio stream; not thread-safe (one owner feeds it)."""

    def __init__(self, in_rate: int, out_rate: int, channels_in: int = 1, quality: Quality = "HQ") -> None:
        if channels_in < 1:
            raise ValueError(f"channels_in must be >= 1, got {channels_in}")
        self.in_rate = in_rate
        self.out_rate = out_rate
        self.channels_in = channels_in
        self._stream = None if in_rate == out_rate else soxr.ResampleStream(in_rate, out_rate, 1, dtype="int16", quality=quality)

    def process(self, pcm: np.ndarray) -> np.ndarray:
        """int16 in (interleaved when channels_in > 1), mono int16 out; output may lag input by the filter delay."""
        mono = downmix(pcm, self.channels_in)
        if self._stream is None:
            return mono.copy()
        return self._stream.resample_chunk(mono)

    def flush(self) -> np.ndarray:
        """The samples still held in the filter; the stream is finished afterwards."""
        if self._stream is None:
            return np.zeros(0, dtype=np.int16)
        return self._stream.resample_chunk(np.zeros(0, dtype=np.int16), last=True)


def resample(pcm: np.ndarray, in_rate: int, out_rate: int, quality: Quality = "HQ") -> np.ndarray:
    """One-shot mono int16 conversion of a whole clip."""
    mono = np.asarray(pcm, dtype=np.int16).reshape(-1)
    if in_rate == out_rate:
        return mono.copy()
    return soxr.resample(mono, in_rate, out_rate, quality=quality)
