"""How long a Realtime session may last (--max-session-duration-s) and sit idle (--session-idle-timeout-s).

Past either, the session gets an `error` event (`session_expired`, or `session_idle_timeout`) and ends: its
WebSocket is closed (1000), its WebRTC call hung up. Idle means no client event and no response running; a
session whose connection dropped is parked for its resume window instead (session_hub.py). One watchdog task
per session, owned here: forgotten (cancelled and awaited) when the session ends. It sleeps until the earliest
time the session could expire and looks again then (activity only moves that time later), never on a period.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from gateway.protocol.errors import ApiError

if TYPE_CHECKING:
    from gateway.realtime.session import RealtimeSession


class SessionLimits:
    def __init__(self, max_duration_s: float, idle_timeout_s: float,
                 end: Callable[[RealtimeSession], Awaitable[None]]) -> None:
        self.max_duration_s = max_duration_s
        self.idle_timeout_s = idle_timeout_s  # 0: no idle limit
        self._end = end
        self._watchdogs: dict[RealtimeSession, asyncio.Task[None]] = {}

    def watch(self, session: RealtimeSession) -> None:
        self._watchdogs[session] = asyncio.create_task(self._watch(session), name=f"limits {session.id}")

    async def forget(self, session: RealtimeSession) -> None:
        task = self._watchdogs.pop(session, None)
        if task is not None and task is not asyncio.current_task():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def close(self) -> None:
        for session in list(self._watchdogs):
            await self.forget(session)

    def _deadline(self, session: RealtimeSession, now: float) -> tuple[float, str]:
        """The earliest the session can expire, and why it would. A response running counts as activity to its
        end (which is later than now): the idle limit cannot pass before now plus the limit."""
        ends = session.opened_at + self.max_duration_s
        idle = math.inf
        if self.idle_timeout_s > 0:
            idle = (session.last_activity if session.active is None else now) + self.idle_timeout_s
        return (ends, "session_expired") if ends <= idle else (idle, "session_idle_timeout")

    async def _watch(self, session: RealtimeSession) -> None:
        while True:
            now = time.monotonic()
            deadline, code = self._deadline(session, now)
            if deadline <= now:
                break
            await asyncio.sleep(deadline - now)
        if code == "session_expired":
            message = f"Your session hit the maximum duration of {self.max_duration_s:g} seconds."
        else:
            message = f"Your session was idle for {self.idle_timeout_s:g} seconds (no event, no response) and ended."
        session.send_error(ApiError(code, message))
        session.close_frame = (1000, code)
        self._watchdogs.pop(session, None)
        await self._end(session)
