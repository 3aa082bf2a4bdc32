"""The one audio value passed between stages: mono int16 PCM with its sample rate."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class AudioChunk:
    pcm: np.ndarray  # int16, shape (n,)
    sample_rate: int

    def __post_init__(self) -> None:
        if self.pcm.dtype != np.int16 or self.pcm.ndim != 1:
            raise ValueError(f"AudioChunk needs 1-D int16 PCM, got {self.pcm.dtype} with shape {self.pcm.shape}")
        if self.sample_rate <= 0:
            raise ValueError(f"sample_rate must be positive, got {self.sample_rate}")

    @property
    def samples(self) -> int:
        return int(self.pcm.shape[0])

    @property
    def duration_ms(self) -> float:
        return 1000.0 * self.samples / self.sample_rate

    def to_float32(self) -> np.ndarray:
        """Samples in [-1, 1), the form faster-whisper and Silero take."""
        return self.pcm.astype(np.float32) / 32768.0

    @classmethod
    def silence(cls, ms: float, rate: int) -> AudioChunk:
        return cls(np.zeros(int(round(rate * ms / 1000.0)), dtype=np.int16), rate)


def float_to_int16(audio: np.ndarray) -> np.ndarray:
    """Clip first: a resampler's overshoot past 1.0 would otherwise wrap around."""
    return np.clip(np.rint(audio * 32768.0), -32768, 32767).astype(np.int16)
