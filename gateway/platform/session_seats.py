"""Admission of Realtime sessions: --max-sessions on this replica, --max-sessions-per-key for a key on
every replica that shares Redis (--redis-url), on this one alone without it.

A session takes its seat before it is set up (before a WebSocket's upgrade, before a WebRTC call's SDP
work), so that a refusal is an HTTP answer: 503 with Retry-After when this replica is full (a router
tries another), 429 when the key has its sessions open. The seat is given back when the session ends or
its set-up fails. In Redis a key's seats expire unless the replica that holds them refreshes them
(`keep_alive`), so a crashed replica's sessions stop counting within --session-seat-ttl-s.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from gateway.protocol.errors import ApiError

if TYPE_CHECKING:
    from gateway.platform.redis_state import RedisState

# A session bound frees up when some session ends: there is no telling when, so a guess.
SESSION_RETRY_S = 5.0
log = logging.getLogger(__name__)


@dataclass(eq=False)
class Seat:
    key_id: str
    id: str = field(default_factory=lambda: secrets.token_hex(12))


class SessionSeats:
    def __init__(self, max_sessions: int, per_key: int, seat_ttl_s: float) -> None:
        self.max_sessions = max_sessions
        self.per_key = per_key
        self.seat_ttl_s = seat_ttl_s  # a seat in Redis lapses this long after its replica last refreshed it
        self.shared: RedisState | None = None  # --redis-url: the per-key count lives there
        self._held: set[Seat] = set()

    async def take(self, key_id: str) -> Seat:
        """A seat for a new session of `key_id`, or the ApiError that refuses it (503 or 429)."""
        if len(self._held) >= self.max_sessions:
            # 503, not 429: this replica is full, not the caller over a limit; a router tries another replica.
            raise ApiError("replica_full", f"This replica has its maximum of {self.max_sessions} sessions open; "
                           "retry later.", type="server_error", status=503, retry_after_s=SESSION_RETRY_S)
        seat = Seat(key_id)
        self._held.add(seat)  # counted before anything awaits: concurrent takes cannot pass the bound
        try:
            if self.shared is not None:
                room = await self.shared.take_seat(key_id, seat.id, self.per_key, self.seat_ttl_s)
            else:
                room = sum(1 for held in self._held if held.key_id == key_id) <= self.per_key
        except BaseException:
            self._held.discard(seat)
            raise
        if not room:
            self._held.discard(seat)
            where = " (on all replicas)" if self.shared is not None else ""
            raise ApiError("too_many_sessions", f"This key has its maximum of {self.per_key} sessions open{where}; "
                           "close one or retry later.", type="rate_limit_error", status=429,
                           retry_after_s=SESSION_RETRY_S)
        return seat

    async def give_back(self, seat: Seat) -> None:
        """The session ended, or was never set up; a seat given back twice counts once."""
        if seat not in self._held:
            return
        self._held.discard(seat)
        if self.shared is not None:
            try:
                await self.shared.give_back_seat(seat.key_id, seat.id)
            except Exception as exc:  # Redis away: the seat lapses by itself
                log.warning("giving back a session seat failed: %s", exc)

    async def give_back_all(self) -> None:
        """Shutdown: this replica's seats stop counting now rather than when they lapse."""
        for seat in list(self._held):
            await self.give_back(seat)

    async def keep_alive(self) -> None:
        """With Redis: refresh this replica's seats well within their expiry, until cancelled."""
        while self.shared is not None:
            try:
                await self.shared.refresh_seats([(seat.key_id, seat.id) for seat in self._held], self.seat_ttl_s)
            except Exception as exc:  # Redis away for a moment: the next refresh tries again
                log.warning("refreshing session seats failed: %s", exc)
            await asyncio.sleep(self.seat_ttl_s / 3)
