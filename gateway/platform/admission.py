"""Admission by measured capacity: a replica whose voice turns have gone slow takes no new session.

On a machine of a given size, each speaker adds work to one shared CPU, and past some number of them
every session slows down together (2 vCPU, 8 sessions: voice-to-voice p95 from 0.6 s to 3 s, measured).
The replica measures its own critical path instead of guessing a session count: the server's part of
each voice turn, from the end of the user's speech (after the VAD's silence wait) to the reply's first
audio. While the 90th percentile of the turns finished in the last `window_s` seconds is over the bound,
a new Realtime session gets 503 `server_at_capacity` with Retry-After before anything is set up (a
router sends it to another replica); sessions already open go on. As they finish turns within the
bound, or once the slow turns leave the window, sessions are taken again.

Pure bookkeeping, no I/O: the responses driver records turns, the session gate asks.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable

from gateway.protocol.errors import ApiError

QUANTILE = 0.9
MIN_TURNS = 3  # fewer turns than this in the window say nothing about capacity


class VoiceAdmission:
    def __init__(self, latency_bound_s: float, window_s: float = 30.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.latency_bound_s = latency_bound_s  # 0: no bound (every session is taken)
        self.window_s = window_s
        self._clock = clock
        self._turns: deque[tuple[float, float]] = deque()  # (when it ended, its seconds), oldest first
        self.refused = 0

    def record(self, seconds: float) -> None:
        """A voice turn's reply started playing `seconds` after the user's speech ended."""
        self._turns.append((self._clock(), seconds))
        self._expire()

    def latency_s(self) -> float | None:
        """The window's 90th percentile (nearest rank), or None with too few turns to tell."""
        self._expire()
        if len(self._turns) < MIN_TURNS:
            return None
        ordered = sorted(seconds for _, seconds in self._turns)
        return ordered[min(len(ordered) - 1, math.ceil(QUANTILE * len(ordered)) - 1)]

    def at_capacity(self) -> bool:
        latency = self.latency_s() if self.latency_bound_s > 0 else None
        return latency is not None and latency > self.latency_bound_s

    def check(self) -> None:
        """Raises the 503 that refuses a new session while the replica is at capacity."""
        if not self.at_capacity():
            return
        self.refused += 1
        latency = self.latency_s() or 0.0
        raise ApiError(
            "server_at_capacity",
            f"This replica is at its voice capacity (its recent turns took {latency * 1000:.0f} ms from the end of "
            f"speech to the first audio, over its bound of {self.latency_bound_s * 1000:.0f} ms); retry later or on "
            "another replica.",
            type="server_error", status=503, retry_after_s=self.retry_after_s(),
        )

    def retry_after_s(self) -> float:
        """Until the oldest turn in the window leaves it (at least a second): the soonest the answer can change
        without new turns."""
        self._expire()
        if not self._turns:
            return 1.0
        return max(1.0, round(self._turns[0][0] + self.window_s - self._clock(), 1))

    def snapshot(self) -> dict[str, float | int | bool | None]:
        """For /healthz: the bound, the window's latency and turns, whether sessions are taken, refusals so far."""
        latency = self.latency_s()
        return {"latency_bound_ms": round(self.latency_bound_s * 1000), "window_s": self.window_s,
                "turns_in_window": len(self._turns),
                "latency_p90_ms": round(latency * 1000) if latency is not None else None,
                "accepting": not self.at_capacity(), "refused": self.refused}

    def _expire(self) -> None:
        horizon = self._clock() - self.window_s
        while self._turns and self._turns[0][0] < horizon:
            self._turns.popleft()
