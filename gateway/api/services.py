"""What the HTTP and WebSocket handlers share: settings, models, auth, limits and live sessions."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gateway.api.stream_hub import StreamHub
from gateway.generation.memory import MemoryAccount, MemoryStore
from gateway.generation.prewarm import Prewarmer
from gateway.generation.runtime import Runtime
from gateway.generation.service import Generator
from gateway.platform.auth import Authenticator, Principal, bearer_token
from gateway.platform.config import Settings
from gateway.platform.idempotency import IdempotencyStore
from gateway.platform.ratelimit import RateLimiter
from gateway.platform.redis_state import REPLICA_TTL_S, RedisState
from gateway.platform.session_seats import Seat, SessionSeats
from gateway.platform.storage.conversations import ConversationStore
from gateway.platform.storage.database import open_database, sqlite_url
from gateway.platform.storage.durable_state import DurableState
from gateway.platform.storage.responses import ResponseStore
from gateway.platform.token_quota import TokenAccount, TokenQuota
from gateway.protocol.errors import ApiError
from gateway.realtime.conversation import new_id
from gateway.realtime.recorder import hand_off_conversation
from gateway.realtime.session_hub import SessionHub
from gateway.realtime.session_limits import SessionLimits

if TYPE_CHECKING:
    from gateway.generation.response_run import ResponseRun
    from gateway.realtime.session import RealtimeSession
    from gateway.realtime.session_hub import Attachment

CLOSE_SERVICE_RESTART = 1012  # WebSocket close code: the session goes on elsewhere (drain)
log = logging.getLogger(__name__)


@dataclass
class Services:
    settings: Settings
    runtime: Runtime
    auth: Authenticator
    limiter: RateLimiter
    quota: TokenQuota  # tokens per minute per key, in the limiter's buckets
    idempotency: IdempotencyStore
    # Live Realtime sessions (WebSocket and WebRTC) and the seat each holds (its key's): see open_session.
    sessions: dict[RealtimeSession, Seat] = field(default_factory=dict)
    # Called with each session that ends (a WebRTC call hangs up with its session); must not block.
    session_end_hooks: list[Callable[[RealtimeSession], None]] = field(default_factory=list)
    # Tasks that outlive a request (WebRTC calls); cancelled and awaited at shutdown.
    background: set[asyncio.Task[None]] = field(default_factory=set)
    conversations: ConversationStore | None = None  # opened in the app's lifespan (open_storage)
    stored_responses: ResponseStore | None = None  # the Responses API's (open_storage)
    # Responses generating on this replica, by id: what POST /v1/responses/{id}/cancel stops.
    running_responses: dict[str, ResponseRun] = field(default_factory=dict)
    durable: DurableState | None = None  # client secrets, idempotency, rate limits (open_storage)
    hub: SessionHub = field(init=False)  # sessions by resume token; those waiting for their client
    streams: StreamHub = field(init=False)  # SSE streams, resumable with Last-Event-ID
    prewarmer: Prewarmer = field(default_factory=Prewarmer)  # drafts prefilled while the user types
    shared: RedisState | None = None  # --redis-url: what replicas share (opened with the storage)
    draining: bool = False  # SIGTERM: no new sessions; see drain()
    limits: SessionLimits = field(init=False)  # each session's duration and idle bounds
    seats: SessionSeats = field(init=False)  # --max-sessions, --max-sessions-per-key (in Redis when shared)

    def __post_init__(self) -> None:
        self.hub = SessionHub(self.settings.resume_window_s, self.end_session)
        self.streams = StreamHub(self.settings.resume_window_s)
        self.limits = SessionLimits(self.settings.max_session_duration_s, self.settings.session_idle_timeout_s,
                                    self.end_session)
        self.seats = SessionSeats(self.settings.max_sessions, self.settings.max_sessions_per_key,
                                  self.settings.session_seat_ttl_s)

    @classmethod
    def create(cls, settings: Settings, runtime: Runtime | None = None) -> Services:
        return cls(
            settings=settings,
            runtime=runtime or Runtime(settings),
            auth=Authenticator(list(settings.api_keys), max_secrets_per_key=settings.max_client_secrets_per_key),
            limiter=(limiter := RateLimiter(settings.rate_limit_rpm)),
            quota=TokenQuota(settings.rate_limit_tpm, limiter),
            idempotency=IdempotencyStore(settings.idempotency_ttl_s),
        )

    async def authorize(self, authorization: str | None, *, allow_ephemeral: bool = False) -> tuple[Principal, dict[str, str]]:
        """Authenticate and rate-limit one request; returns the caller and the rate-limit headers."""
        principal = await self.auth.authenticate(bearer_token(authorization), allow_ephemeral=allow_ephemeral)
        return principal, await self.limiter.check(principal.key_id)

    async def take_seat(self, key_id: str) -> Seat:
        """Room for a new session of this key, before it is set up: 503 while draining, while its voice turns run
        slow (--admission-latency-ms) or when the replica is full (--max-sessions), 429 past
        --max-sessions-per-key. Given back by end_session once the session is open (open_session), by the caller
        (seats.give_back) when its set-up fails first."""
        if self.draining:
            raise ApiError("replica_draining", "This replica is shutting down; open the session on another one.",
                           type="server_error", status=503, retry_after_s=1.0)
        self.runtime.admission.check()
        return await self.seats.take(key_id)

    async def open_session(self, session: RealtimeSession, principal: Principal, seat: Seat) -> Attachment:
        """Count a new session in on its seat and spend the client secret that opened it, all or nothing (a
        refused spend leaves the seat to the caller). Returns the opening transport's hold on the session."""
        self.sessions[session] = seat
        session.tokens = TokenAccount(self.quota, principal.key_id)  # the quota its responses draw on
        if self.conversations is not None:  # its key's memory, when the key turned it on (gateway/generation/memory.py)
            session.memory = MemoryAccount(MemoryStore(self.conversations.engine), principal.key_id)
        try:
            await self.auth.spend(principal)
        except BaseException:
            self.sessions.pop(session, None)
            raise
        self.limits.watch(session)
        return self.hub.add(session, principal.key_id)

    async def open_storage(self) -> None:
        url = self.settings.database_url or sqlite_url(self.settings.data_dir)
        engine = await open_database(url, shared_by_replicas=bool(self.settings.redis_url))
        self.conversations = ConversationStore(engine)
        self.stored_responses = ResponseStore(engine)
        self.durable = DurableState(engine)
        if self.settings.redis_url:
            # Secrets, idempotency answers and buckets live in Redis for every replica, not in this database.
            self.shared = RedisState(self.settings.redis_url)
            await self.shared.ping()
            self.auth.shared = self.idempotency.shared = self.limiter.shared = self.seats.shared = self.shared
            self._in_background(self.seats.keep_alive(), "session seats")
            return
        snapshot = await self.durable.load(self.settings.idempotency_ttl_s)
        self.auth.restore(snapshot.secrets)
        self.idempotency.restore(snapshot.idempotency)
        self.limiter.restore(snapshot.buckets)
        self.auth.journal = self.idempotency.journal = self.limiter.journal = self.durable

    async def drain(self, timeout_s: float) -> None:
        """SIGTERM: take no new session (503, and /healthz says draining, so the router sends them to another
        replica), let the replies in flight finish for up to `timeout_s`, then hand every session off: its
        conversation is stored, an `error` event `session_handoff` names it, and the connection closes with
        1012 (service restart) and the same reason, so the client opens a session on another replica with
        ?conversation=<id> and goes on where it was."""
        self.draining = True
        deadline = time.monotonic() + timeout_s
        while any(session.active is not None for session in self.sessions) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        results = await asyncio.gather(*(self._hand_off(session, seat.key_id)
                                         for session, seat in list(self.sessions.items())), return_exceptions=True)
        for failure in (result for result in results if isinstance(result, BaseException)):
            log.error("a session's hand-off failed", exc_info=failure)

    async def _hand_off(self, session: RealtimeSession, owner: str) -> None:
        try:
            conversation_id = await hand_off_conversation(session, self.store, owner)
            reason = json.dumps({"conversation": conversation_id})
            session.send_error(ApiError("session_handoff", f"This replica is shutting down: open a session on another "
                                        f"one with ?conversation={conversation_id} to go on.", "conversation"))
            session.close_frame = (CLOSE_SERVICE_RESTART, reason)
        finally:
            await self.end_session(session)

    def announce_replica(self) -> None:
        """With Redis and --replica-url: keep this replica in the directory that other replicas forward by,
        refreshed well within its entry's expiry (a task in `background`, cancelled at shutdown)."""
        shared, url = self.shared, self.settings.replica_url
        if shared is None or url is None:
            return

        async def refresh() -> None:
            while True:
                try:
                    await shared.announce_replica(self.settings.replica_id, url)
                except Exception as exc:  # Redis away for a moment: the next refresh tries again
                    log.warning("announcing replica %s failed: %s", self.settings.replica_id, exc)
                await asyncio.sleep(REPLICA_TTL_S / 3)

        self._in_background(refresh(), "replica announcer")

    def _in_background(self, work: Coroutine[Any, Any, None], name: str) -> None:
        """A task in `background`: cancelled and awaited at shutdown."""
        task = asyncio.create_task(work, name=name)
        self.background.add(task)
        task.add_done_callback(self.background.discard)

    async def close_shared(self) -> None:
        if self.shared is not None:
            await self.seats.give_back_all()
            with contextlib.suppress(Exception):  # Redis may be gone first; the entry then expires by itself
                await self.shared.withdraw_replica(self.settings.replica_id)
            await self.shared.close()

    def new_call_id(self) -> str:
        """A call id that names this replica, so that another replica can forward its hangup here."""
        return new_id(f"rtc_{self.settings.replica_id}")

    async def owner_url(self, replica_id: str) -> str | None:
        """Where another replica answers (the Redis directory), or None: this one, unknown, or gone."""
        if replica_id == self.settings.replica_id or self.shared is None:
            return None
        return await self.shared.replica_url(replica_id)

    @property
    def store(self) -> ConversationStore:
        if self.conversations is None:  # only before the lifespan started: requests come after it
            raise ApiError("storage_unavailable", "The conversation store is not open.", type="server_error", status=503)
        return self.conversations

    @property
    def responses(self) -> ResponseStore:
        if self.stored_responses is None:  # as `store`: only before the lifespan started
            raise ApiError("storage_unavailable", "The response store is not open.", type="server_error", status=503)
        return self.stored_responses

    async def end_session(self, session: RealtimeSession) -> None:
        """The session is over: uncounted, unresumable, closed, and its transport told (a WebRTC call hangs up)."""
        seat = self.sessions.pop(session, None)
        self.hub.remove(session)
        if seat is not None:
            await self.seats.give_back(seat)
        await self.limits.forget(session)
        await session.close()
        for hook in self.session_end_hooks:
            hook(session)

    def require_model(self, model: str, param: str = "model") -> None:
        if model not in self.runtime.model_names:
            raise ApiError(
                "model_not_found",
                f"The model '{model}' does not exist. Available: '{self.settings.model_name}'.",
                param,
                status=404,
            )

    def generator(self) -> Generator:
        """The generation service on the loaded model (503 until it is)."""
        self.require_ready()
        runtime = self.runtime
        assert runtime.engine is not None
        return Generator(runtime.engine, runtime.safety, runtime.classifier, self.settings.safety_classifier_timeout_s)

    def require_ready(self) -> None:
        runtime = self.runtime
        if runtime.load_error:
            raise ApiError("model_load_failed", f"The models failed to load: {runtime.load_error}", type="server_error", status=503)
        if not runtime.ready.is_set() or runtime.engine is None:
            raise ApiError("model_not_ready", "The models are still loading; retry shortly.", type="server_error", status=503, retry_after_s=2.0)
