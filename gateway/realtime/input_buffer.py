"""The input audio buffer of a session: 16 kHz samples addressed by stream time. No I/O."""

from __future__ import annotations

import numpy as np

RATE = 16000


class InputAudioBuffer:
    """Holds the samples from `start` to `end` of the session's input stream (sample indices).

    Old audio is dropped from the front (`discard_before`) so a long call never grows it without limit.
    """

    def __init__(self) -> None:
        self._chunks: list[np.ndarray] = []
        self.start = 0  # stream index of the first sample held
        self.end = 0  # stream index after the last sample received

    @staticmethod
    def ms_to_index(ms: float) -> int:
        return int(round(ms * RATE / 1000))

    @staticmethod
    def index_to_ms(index: int) -> float:
        return 1000.0 * index / RATE

    @property
    def held_ms(self) -> float:
        return self.index_to_ms(self.end - self.start)

    def append(self, pcm: np.ndarray) -> None:
        self._chunks.append(pcm)
        self.end += len(pcm)

    def slice(self, begin: int, stop: int) -> np.ndarray:
        """Samples in [begin, stop), clamped to what is held."""
        self._compact()
        held = self._chunks[0] if self._chunks else np.zeros(0, dtype=np.int16)
        begin = max(begin, self.start) - self.start
        stop = min(stop, self.end) - self.start
        return held[begin:stop].copy() if stop > begin else np.zeros(0, dtype=np.int16)

    def discard_before(self, index: int) -> None:
        index = min(max(index, self.start), self.end)
        if index == self.start:
            return
        self._compact()
        self._chunks = [self._chunks[0][index - self.start :]] if self._chunks else []
        self.start = index

    def clear(self) -> None:
        self._chunks = []
        self.start = self.end

    def _compact(self) -> None:
        if len(self._chunks) > 1:
            self._chunks = [np.concatenate(self._chunks)]
