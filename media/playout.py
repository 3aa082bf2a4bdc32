"""Outbound audio queue, read in fixed frames: the paced track pulls, the session writes and clears.

Pure core (no asyncio, no aiortc). A lock guards every method: the writer and the reader run in
different tasks and may run in different threads.
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class PlayoutFrame:
    pcm: np.ndarray  # exactly frame_samples int16; audio first, silence after
    item_id: str | None  # the item of the frame's first audio sample; None when all silence
    started: bool  # first frame with audio after silence (or after clear())
    stopped: bool  # audio had been playing and the buffer is now drained
    audio_samples: int  # how many samples at the front are audio, not padding


class PlayoutBuffer:
    def __init__(self, sample_rate: int, frame_samples: int) -> None:
        if sample_rate <= 0 or frame_samples <= 0:
            raise ValueError("sample_rate and frame_samples must be positive")
        self.sample_rate = sample_rate
        self.frame_samples = frame_samples
        self._lock = threading.Lock()
        self._queue: deque[tuple[str, np.ndarray]] = deque()
        self._head_offset = 0  # samples of the queue's first segment already handed out
        self._queued = 0
        self._played: dict[str, int] = {}
        self._playing = False
        self._producing = False
        self._held = False  # paused where it is: frames are silence, and nothing queued is taken

    def _ms(self, samples: int) -> float:
        return 1000.0 * samples / self.sample_rate

    def write(self, item_id: str, pcm: np.ndarray) -> None:
        data = np.asarray(pcm, dtype=np.int16).reshape(-1)
        if not data.size:
            return
        with self._lock:
            self._queue.append((item_id, data.copy()))
            self._queued += data.size

    def set_producing(self, producing: bool) -> None:
        """While a producer says more audio is coming, running dry is an underrun, not a stop.

        With it off (the default) every drain reports stopped; turning it off after a drain
        makes the next frame report stopped.
        """
        with self._lock:
            self._producing = producing

    def hold(self, held: bool) -> None:
        """Pause the queued audio where it is (silence goes out, with no stopped flag), or play it on."""
        with self._lock:
            self._held = held

    def read_frame(self) -> PlayoutFrame:
        out = np.zeros(self.frame_samples, dtype=np.int16)
        with self._lock:
            if self._held:
                return PlayoutFrame(pcm=out, item_id=None, started=False, stopped=False, audio_samples=0)
            filled = 0
            first_item: str | None = None
            while filled < self.frame_samples and self._queue:
                item_id, data = self._queue[0]
                take = min(self.frame_samples - filled, data.size - self._head_offset)
                out[filled : filled + take] = data[self._head_offset : self._head_offset + take]
                filled += take
                self._head_offset += take
                self._played[item_id] = self._played.get(item_id, 0) + take
                first_item = first_item or item_id
                if self._head_offset == data.size:
                    self._queue.popleft()
                    self._head_offset = 0
            self._queued -= filled
            started = filled > 0 and not self._playing
            if started:
                self._playing = True
            stopped = self._playing and self._queued == 0 and not self._producing
            if stopped:
                self._playing = False
        return PlayoutFrame(pcm=out, item_id=first_item, started=started, stopped=stopped, audio_samples=filled)

    def clear(self) -> int:
        """Drop everything queued; returns the ms dropped (rounded). The next frame is silence, with no stopped flag."""
        with self._lock:
            dropped = self._queued
            self._queue.clear()
            self._head_offset = 0
            self._queued = 0
            self._playing = False
            self._producing = False
            self._held = False
        return round(self._ms(dropped))

    def played_ms(self, item_id: str) -> float:
        """Audio of this item handed to the reader so far (not what was written)."""
        with self._lock:
            return self._ms(self._played.get(item_id, 0))

    @property
    def queued_ms(self) -> float:
        with self._lock:
            return self._ms(self._queued)

