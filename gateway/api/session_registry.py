"""The live Realtime sessions of this replica (WebSocket and WebRTC): the seat each holds, the hub that parks
them for a resume, their duration and idle limits, the drain at SIGTERM, and the tasks that outlive a request."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gateway.api.gate import Gate
from gateway.api.stores import Stores
from gateway.generation.memory import MemoryAccount, MemoryStore
from gateway.platform.admission import VoiceAdmission
from gateway.platform.auth import Principal
from gateway.platform.config import Settings
from gateway.platform.session_seats import Seat, SessionSeats
from gateway.platform.token_quota import TokenAccount
from gateway.protocol.errors import ApiError
from gateway.realtime.recorder import hand_off_conversation
from gateway.realtime.session_hub import SessionHub
from gateway.realtime.session_limits import SessionLimits

if TYPE_CHECKING:
    from gateway.realtime.session import RealtimeSession
    from gateway.realtime.session_hub import Attachment

CLOSE_SERVICE_RESTART = 1012  # WebSocket close code: the session goes on elsewhere (drain)
log = logging.getLogger(__name__)


@dataclass
class SessionRegistry:
    settings: Settings
    admission: VoiceAdmission  # new sessions refused while voice turns run slow
    gate: Gate  # a session's tokens draw on its key's quota; its client secret is spent as it opens
    stores: Stores  # a session's key's memory; where a drained session's conversation goes
    # Live sessions and the seat each holds (its key's): see open_session.
    live: dict[RealtimeSession, Seat] = field(default_factory=dict)
    # Called with each session that ends (a WebRTC call hangs up with its session); must not block.
    end_hooks: list[Callable[[RealtimeSession], None]] = field(default_factory=list)
    # Tasks that outlive a request (WebRTC calls); cancelled and awaited at shutdown.
    background: set[asyncio.Task[None]] = field(default_factory=set)
    draining: bool = False  # SIGTERM: no new sessions; see drain()
    hub: SessionHub = field(init=False)  # sessions by resume token; those waiting for their client
    limits: SessionLimits = field(init=False)  # each session's duration and idle bounds
    seats: SessionSeats = field(init=False)  # --max-sessions, --max-sessions-per-key (in Redis when shared)

    def __post_init__(self) -> None:
        settings = self.settings
        self.hub = SessionHub(settings.resume_window_s, self.end_session)
        self.limits = SessionLimits(settings.max_session_duration_s, settings.session_idle_timeout_s, self.end_session)
        self.seats = SessionSeats(settings.max_sessions, settings.max_sessions_per_key, settings.session_seat_ttl_s)

    @contextlib.asynccontextmanager
    async def seat(self, key_id: str) -> AsyncIterator[Seat]:
        """Room for a new session of this key while it is set up, taken before anything of it is (before an
        upgrade, before SDP work), so that a refusal is an HTTP answer: 503 while draining, while its voice turns
        run slow (--admission-latency-ms) or when the replica is full (--max-sessions), 429 past
        --max-sessions-per-key. A session opened on it (open_session) keeps it until end_session; otherwise it
        is given back as the block ends, however it ends."""
        if self.draining:
            raise ApiError("replica_draining", "This replica is shutting down; open the session on another one.",
                           type="server_error", status=503, retry_after_s=1.0)
        self.admission.check()
        taken = await self.seats.take(key_id)
        try:
            yield taken
        finally:
            if not any(held is taken for held in self.live.values()):  # no session holds it: the set-up failed
                await self.seats.give_back(taken)  # (a second give-back, after end_session's, counts once)

    async def open_session(self, session: RealtimeSession, principal: Principal, seat: Seat) -> Attachment:
        """Count a new session in on its seat and spend the client secret that opened it, all or nothing (a
        refused spend leaves the seat to the block that took it: seat()). Returns the opening transport's hold on
        the session."""
        self.live[session] = seat
        self.admission.opened(session.id)
        session.tokens = TokenAccount(self.gate.quota, principal.key_id)  # the quota its responses draw on
        conversations = self.stores.conversations
        if conversations is not None:  # its key's memory, when the key turned it on (gateway/generation/memory.py)
            session.memory = MemoryAccount(MemoryStore(conversations.engine), principal.key_id)
        try:
            await self.gate.auth.spend(principal)
        except BaseException:
            self.live.pop(session, None)
            self.admission.closed(session.id)
            raise
        self.limits.watch(session)
        return self.hub.add(session, principal.key_id)

    async def end_session(self, session: RealtimeSession) -> None:
        """The session is over: uncounted, unresumable, closed, and its transport told (a WebRTC call hangs up)."""
        seat = self.live.pop(session, None)
        self.admission.closed(session.id)
        self.hub.remove(session)
        if seat is not None:
            await self.seats.give_back(seat)
        await self.limits.forget(session)
        await session.close()
        for hook in self.end_hooks:
            hook(session)

    async def drain(self, timeout_s: float) -> None:
        """SIGTERM: take no new session (503, and /healthz says draining, so the router sends them to another
        replica), let the replies in flight finish for up to `timeout_s`, then hand every session off: its
        conversation is stored, an `error` event `session_handoff` names it, and the connection closes with
        1012 (service restart) and the same reason, so the client opens a session on another replica with
        ?conversation=<id> and goes on where it was."""
        self.draining = True
        deadline = time.monotonic() + timeout_s
        while any(session.active is not None for session in self.live) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        results = await asyncio.gather(*(self._hand_off(session, seat.key_id)
                                         for session, seat in list(self.live.items())), return_exceptions=True)
        for failure in (result for result in results if isinstance(result, BaseException)):
            log.error("a session's hand-off failed", exc_info=failure)

    async def _hand_off(self, session: RealtimeSession, owner: str) -> None:
        try:
            conversation_id = await hand_off_conversation(session, self.stores.store, owner)
            reason = json.dumps({"conversation": conversation_id})
            session.send_error(ApiError("session_handoff", f"This replica is shutting down: open a session on another "
                                        f"one with ?conversation={conversation_id} to go on.", "conversation"))
            session.close_frame = (CLOSE_SERVICE_RESTART, reason)
        finally:
            await self.end_session(session)

    def in_background(self, work: Coroutine[Any, Any, None], name: str) -> None:
        """A task in `background`: cancelled and awaited at shutdown."""
        task = asyncio.create_task(work, name=name)
        self.background.add(task)
        task.add_done_callback(self.background.discard)

    async def stop_timers(self) -> None:
        """First at shutdown: the resume windows' timers and the duration and idle watchdogs (their sessions are
        closed by close)."""
        await self.hub.close()
        await self.limits.close()

    async def close(self) -> None:
        """Every session closed, every background task cancelled and awaited, and the shared seats given back."""
        await asyncio.gather(*(session.close() for session in list(self.live)), return_exceptions=True)
        for task in list(self.background):
            task.cancel()
        if self.background:
            await asyncio.wait(self.background, timeout=5)
        if self.seats.shared is not None:
            await self.seats.give_back_all()
