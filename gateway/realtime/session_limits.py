"""How long a Realtime session may last (--max-session-duration-s) and sit idle (--session-idle-timeout-s).

Past either, the session gets an `error` event (`session_expired`, or `session_idle_timeout`) and ends: its
WebSocket is closed (1000), its WebRTC call hung up. Idle means no client event and no response running; a
session whose connection dropped is parked for its resume window instead (session_hub.py). One watchdog task
per session, owned here: forgotten (cancelled and awaited) when the session ends.
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

CHECK_S = 5.0  # the longest sleep between two looks at a session (activity moves its idle deadline)


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

    def _deadline(self, session: RealtimeSession) -> tuple[float, str]:
        ends = session.opened_at + self.max_duration_s
        idle = (session.last_activity + self.idle_timeout_s
                if self.idle_timeout_s > 0 and session.active is None else math.inf)
        return (ends, "session_expired") if ends <= idle else (idle, "session_idle_timeout")

    async def _watch(self, session: RealtimeSession) -> None:
        while True:
            deadline, code = self._deadline(session)
            wait = deadline - time.monotonic()
            if wait <= 0:
                break
            await asyncio.sleep(min(wait, CHECK_S))
        if code == "session_expired":
            message = f"Your session hit the maximum duration of {self.max_duration_s:g} seconds."
        else:
            message = f"Your session was idle for {self.idle_timeout_s:g} seconds (no event, no response) and ended."
        session.send_error(ApiError(code, message))
        session.close_frame = (1000, code)
        self._watchdogs.pop(session, None)
        await self._end(session)
