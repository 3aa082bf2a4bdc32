"""Realtime sessions by resume token, and the ones waiting for their client to come back.

A session outlives its transport: when a connection drops without a close, the session is parked
here, still running (a reply goes on generating, its events pile up in the outbox), for the resume
window. A client that reconnects with the token (and the last sequence number it received) takes it
over; otherwise the window's timer ends it. The hub owns those timers and cancels them at shutdown.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from gateway.protocol.errors import ApiError

if TYPE_CHECKING:
    from gateway.realtime.session import RealtimeSession


@dataclass
class Attachment:
    """One transport's hold on a session; `superseded` is set when another transport takes it over."""

    superseded: asyncio.Event = field(default_factory=asyncio.Event)


@dataclass
class _Entry:
    session: RealtimeSession
    key_id: str
    attachment: Attachment | None = None
    expiry: asyncio.Task[None] | None = None


class SessionHub:
    def __init__(self, window_s: float, end_session: Callable[[RealtimeSession], Awaitable[None]]) -> None:
        self.window_s = window_s
        self._end_session = end_session
        self._entries: dict[str, _Entry] = {}

    @property
    def parked(self) -> int:
        return sum(1 for entry in self._entries.values() if entry.attachment is None)

    def add(self, session: RealtimeSession, key_id: str) -> Attachment:
        attachment = Attachment()
        self._entries[session.resume_token] = _Entry(session, key_id, attachment)
        return attachment

    def take(self, token: str, key_id: str) -> tuple[RealtimeSession, Attachment]:
        """The session with this resume token, for the key that opened it (another key gets the same
        404 as a wrong token); its current transport, if any, is superseded."""
        entry = self._entries.get(token)
        if entry is None or entry.key_id != key_id or entry.session.outbox.closed:
            raise ApiError("session_not_found", "No session to resume with this token: it ended, its resume window "
                           "passed, or it belongs to another key.", "resume", status=404)
        return entry.session, self.reattach(entry.session)

    def reattach(self, session: RealtimeSession) -> Attachment:
        entry = self._entries[session.resume_token]
        if entry.expiry is not None:
            entry.expiry.cancel()
            entry.expiry = None
        if entry.attachment is not None:
            entry.attachment.superseded.set()
        entry.attachment = Attachment()
        return entry.attachment

    def park(self, session: RealtimeSession, attachment: Attachment) -> bool:
        """The transport holding `attachment` dropped. True when the session now waits here for its
        client (the caller must not end it); False when it cannot (resume is off, or the session is over)."""
        entry = self._entries.get(session.resume_token)
        if entry is None or entry.attachment is not attachment:
            return entry is not None  # another transport took it over: not this one's to end
        if self.window_s <= 0 or session.outbox.closed:
            return False
        entry.attachment = None
        entry.expiry = asyncio.create_task(self._expire(entry), name=f"resume window {session.id}")
        return True

    async def _expire(self, entry: _Entry) -> None:
        await asyncio.sleep(self.window_s)
        entry.expiry = None
        await self._end_session(entry.session)

    def remove(self, session: RealtimeSession) -> None:
        entry = self._entries.pop(session.resume_token, None)
        if entry is not None and entry.expiry is not None:
            entry.expiry.cancel()

    async def close(self) -> None:
        timers = [entry.expiry for entry in self._entries.values() if entry.expiry is not None]
        for timer in timers:
            timer.cancel()
        for timer in timers:
            with contextlib.suppress(asyncio.CancelledError):
                await timer
