"""Admission by measured capacity: a replica whose open sessions' voice turns have gone slow takes no new session.

On a machine of a given size, each speaker adds work to one shared CPU, and past some number of them
every session slows down together (2 vCPU, 8 sessions: voice-to-voice p95 from 0.6 s to 3 s, measured).
The replica measures its own critical path instead of guessing a session count: the server's part of
each voice turn, from the end of the user's speech (after the VAD's silence wait) to the reply's first
audio. The bound protects the sessions open now, so it is judged on their turns alone:
- no session open: a new one is always taken (a turn of a session that has ended says nothing of anyone's);
- sessions open: while the 90th percentile of their turns of the last `window_s` seconds is over the bound,
  a new Realtime session gets 503 `server_at_capacity` with Retry-After before anything is set up (a router
  sends it to another replica); the sessions already open go on;
- a bound a session alone exceeds on this host (a slower CPU than the bound was set for) is no measure of
  load: the bound judged is the larger of the one set and SOLO_HEADROOM times the 90th percentile of the
  recent turns of sessions that ran alone, so one caller never locks the replica.
As the open sessions finish turns within the bound, as their slow turns leave the window, or as they end,
sessions are taken again.

Pure bookkeeping, no I/O: the session registry opens and closes sessions, the responses driver records turns,
the session gate asks.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from gateway.protocol.errors import ApiError

QUANTILE = 0.9
MIN_TURNS = 3  # fewer turns than this in the window say nothing about capacity
# What load may cost a session before the replica refuses more: a turn 1.5x what it takes alone (AMD Zen 3, 2
# vCPU, `gateway bench --mode voice`: 2 sessions took 1.2x one session's voice-to-voice p50, 4 sessions 2.1x).
SOLO_HEADROOM = 1.5
SOLO_TURNS = 20  # the turns of sessions that ran alone kept for the host's own speed (the latest)


@dataclass(frozen=True)
class AnsweredTurn:
    ended: float  # clock seconds
    seconds: float  # end of speech to first audio
    session_id: str


class VoiceAdmission:
    def __init__(self, latency_bound_s: float, window_s: float = 30.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.latency_bound_s = latency_bound_s  # 0: no bound (every session is taken)
        self.window_s = window_s
        self._clock = clock
        self._open: set[str] = set()  # the Realtime sessions open on this replica
        self._turns: deque[AnsweredTurn] = deque()  # the open sessions' turns in the window, oldest first
        self._solo: deque[float] = deque(maxlen=SOLO_TURNS)  # turns of a session that was the only one open
        self.refused = 0

    def opened(self, session_id: str) -> None:
        self._open.add(session_id)

    def closed(self, session_id: str) -> None:
        """The session ended: its turns no longer judge the replica."""
        self._open.discard(session_id)
        self._turns = deque(turn for turn in self._turns if turn.session_id != session_id)

    def record(self, session_id: str, seconds: float) -> None:
        """A voice turn of an open session: its reply started playing `seconds` after the user's speech ended."""
        if session_id not in self._open:
            return  # it ended meanwhile
        self._turns.append(AnsweredTurn(self._clock(), seconds, session_id))
        if self._open == {session_id}:
            self._solo.append(seconds)
        self._expire()

    def latency_s(self) -> float | None:
        """The 90th percentile (nearest rank) of the open sessions' turns in the window, or None with too few."""
        self._expire()
        return _p90([turn.seconds for turn in self._turns])

    def solo_latency_s(self) -> float | None:
        """The 90th percentile of the recent turns of sessions that ran alone: what this host takes unloaded."""
        return _p90(list(self._solo))

    def bound_s(self) -> float:
        """The bound judged: the one set, or SOLO_HEADROOM times a lone session's turns where that is more."""
        solo = self.solo_latency_s()
        return max(self.latency_bound_s, SOLO_HEADROOM * solo) if solo is not None else self.latency_bound_s

    def at_capacity(self) -> bool:
        if self.latency_bound_s <= 0 or not self._open:
            return False
        latency = self.latency_s()
        return latency is not None and latency > self.bound_s()

    def check(self) -> None:
        """Raises the 503 that refuses a new session while the replica is at capacity."""
        if not self.at_capacity():
            return
        self.refused += 1
        latency = self.latency_s() or 0.0
        raise ApiError(
            "server_at_capacity",
            f"This replica is at its voice capacity: the turns of the {len(self._open)} sessions open here took "
            f"{latency * 1000:.0f} ms from the end of speech to the first audio (90th percentile), over the "
            f"{self.bound_s() * 1000:.0f} ms that protects them; retry later or on another replica.",
            type="server_error", status=503, retry_after_s=self.retry_after_s(),
        )

    def retry_after_s(self) -> float:
        """Until the oldest judged turn leaves the window (at least a second): the soonest the answer can change
        without new turns or a session ending."""
        self._expire()
        if not self._turns:
            return 1.0
        return max(1.0, round(self._turns[0].ended + self.window_s - self._clock(), 1))

    def snapshot(self) -> dict[str, float | int | bool | None]:
        """For /healthz: the bound set and the one judged, the open sessions and their turns' latency, the lone
        sessions' latency, whether sessions are taken, refusals so far."""
        latency, solo = self.latency_s(), self.solo_latency_s()
        return {"latency_bound_ms": round(self.latency_bound_s * 1000), "window_s": self.window_s,
                "bound_judged_ms": round(self.bound_s() * 1000), "sessions_open": len(self._open),
                "turns_in_window": len(self._turns),
                "latency_p90_ms": round(latency * 1000) if latency is not None else None,
                "alone_latency_p90_ms": round(solo * 1000) if solo is not None else None,
                "accepting": not self.at_capacity(), "refused": self.refused}

    def _expire(self) -> None:
        horizon = self._clock() - self.window_s
        while self._turns and self._turns[0].ended < horizon:
            self._turns.popleft()


def _p90(seconds: list[float]) -> float | None:
    if len(seconds) < MIN_TURNS:
        return None
    ordered = sorted(seconds)
    return ordered[min(len(ordered) - 1, math.ceil(QUANTILE * len(ordered)) - 1)]
