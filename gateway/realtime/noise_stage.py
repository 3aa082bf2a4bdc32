"""A session's noise reduction (audio.input.noise_reduction): the audio the VAD, the end-of-turn model and Whisper
hear. The enhancer (media/denoise.py) works on the runtime's shared denoise thread: its state is made there, used
there and freed there, so a frame it is still working on is never freed under it."""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import Executor

import numpy as np

from gateway.platform import metrics
from gateway.protocol.session_config import NoiseReductionConfig
from inference.cpu import charge
from media.denoise import NoiseReducer

FRAME_SAMPLES = 16000 // 50  # a 20 ms frame at 16 kHz: the unit its cost is measured in


class NoiseStage:
    def __init__(self, executor: Executor) -> None:
        self._executor = executor
        self._reducer: NoiseReducer | None = None  # made when first needed

    async def process(self, pcm: np.ndarray, setting: NoiseReductionConfig | None) -> np.ndarray:
        """16 kHz int16 in and out: as it came with no setting, enhanced (and lagging ~30 ms) with one."""
        kind = setting.type if setting is not None else None
        loop = asyncio.get_running_loop()
        if self._reducer is not None and self._reducer.kind != kind:
            old, self._reducer = self._reducer, None
            await loop.run_in_executor(self._executor, old.close)
        if kind is None:
            return pcm
        if self._reducer is None:
            self._reducer = await loop.run_in_executor(self._executor, NoiseReducer, kind)
        return await loop.run_in_executor(self._executor, _reduce, self._reducer, pcm)

    def close(self) -> None:
        if self._reducer is None:
            return
        try:  # after the frame the enhancer may still be working on, on its thread
            self._executor.submit(self._reducer.close)
        except RuntimeError:  # the process is shutting down: its thread takes no more work
            self._reducer.close()
        self._reducer = None


def _reduce(reducer: NoiseReducer, pcm: np.ndarray) -> np.ndarray:
    """On the denoise thread: its time goes to the core-seconds and the per-frame metric."""
    started = time.perf_counter()
    out = reducer.process(pcm)
    spent = time.perf_counter() - started
    charge("noise_reduction", spent)
    metrics.NOISE_REDUCTION_FRAME_SECONDS.observe(spent * FRAME_SAMPLES / max(len(pcm), 1))
    return out
