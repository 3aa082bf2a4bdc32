"""Test stand-ins for a microphone: audio tracks that pace frames by the wall clock."""

from __future__ import annotations

import asyncio
import fractions
import time

import numpy as np
from aiortc import MediaStreamTrack
from av import AudioFrame

RATE = 48000
FRAME = 960


class PacedClipTrack(MediaStreamTrack):
    """Plays a clip in 20 ms frames by the wall clock, then silence: a stand-in for a microphone."""

    kind = "audio"

    def __init__(self, pcm48k: np.ndarray) -> None:
        super().__init__()
        self._frames: list[np.ndarray] = []
        self._start: float | None = None
        self._pts = 0
        self.play(pcm48k)

    def play(self, pcm48k: np.ndarray) -> None:
        """Speak now: queue a clip after whatever is still playing."""
        padded = np.concatenate([pcm48k, np.zeros((-pcm48k.size) % FRAME, dtype=np.int16)])
        self._frames.extend(padded.reshape(-1, FRAME))

    async def recv(self) -> AudioFrame:
        if self._start is None:
            self._start = time.monotonic()
        else:
            self._pts += FRAME
            await asyncio.sleep(max(0.0, self._start + self._pts / RATE - time.monotonic()))
        pcm = self._frames.pop(0) if self._frames else np.zeros(FRAME, dtype=np.int16)
        frame = AudioFrame.from_ndarray(pcm.reshape(1, -1), format="s16", layout="mono")
        frame.sample_rate = RATE
        frame.pts = self._pts
        frame.time_base = fractions.Fraction(1, RATE)
        return frame
