"""What the HTTP and WebSocket handlers share: settings, models, auth, limits and live sessions."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from gateway.auth import Authenticator, Principal, bearer_token
from gateway.config import Settings
from gateway.idempotency import IdempotencyStore
from gateway.prewarm import Prewarmer
from gateway.protocol.errors import ApiError, overloaded
from gateway.ratelimit import RateLimiter
from gateway.runtime import Runtime
from gateway.session_hub import SessionHub
from gateway.storage.conversations import ConversationStore
from gateway.storage.database import open_database, sqlite_url
from gateway.storage.durable_state import DurableState
from gateway.stream_hub import StreamHub

if TYPE_CHECKING:
    from gateway.session import RealtimeSession
    from gateway.session_hub import Attachment
    from gateway.transports.webrtc import Call

# A session bound frees up when some session ends: there is no telling when, so a guess.
SESSION_RETRY_S = 5.0


@dataclass
class Services:
    settings: Settings
    runtime: Runtime
    auth: Authenticator
    limiter: RateLimiter
    idempotency: IdempotencyStore
    # Live Realtime sessions (WebSocket and WebRTC) and the key that opened each: see open_session.
    sessions: dict[RealtimeSession, str] = field(default_factory=dict)
    calls: dict[str, Call] = field(default_factory=dict)  # live WebRTC calls by id
    # Tasks that outlive a request (WebRTC calls); cancelled and awaited at shutdown.
    background: set[asyncio.Task[None]] = field(default_factory=set)
    conversations: ConversationStore | None = None  # opened in the app's lifespan (open_storage)
    durable: DurableState | None = None  # client secrets, idempotency, rate limits (open_storage)
    hub: SessionHub = field(init=False)  # sessions by resume token; those waiting for their client
    streams: StreamHub = field(init=False)  # SSE streams, resumable with Last-Event-ID
    prewarmer: Prewarmer = field(default_factory=Prewarmer)  # drafts prefilled while the user types

    def __post_init__(self) -> None:
        self.hub = SessionHub(self.settings.resume_window_s, self.end_session)
        self.streams = StreamHub(self.settings.resume_window_s)

    @classmethod
    def create(cls, settings: Settings, runtime: Runtime | None = None) -> Services:
        return cls(
            settings=settings,
            runtime=runtime or Runtime(settings),
            auth=Authenticator(list(settings.api_keys), max_secrets_per_key=settings.max_client_secrets_per_key),
            limiter=RateLimiter(settings.rate_limit_rpm),
            idempotency=IdempotencyStore(settings.idempotency_ttl_s),
        )

    def authorize(self, authorization: str | None, *, allow_ephemeral: bool = False) -> tuple[Principal, dict[str, str]]:
        """Authenticate and rate-limit one request; returns the caller and the rate-limit headers."""
        principal = self.auth.authenticate(bearer_token(authorization), allow_ephemeral=allow_ephemeral)
        return principal, self.limiter.check(principal.key_id)

    def check_session_room(self, key_id: str) -> None:
        """429 when the gateway (--max-sessions) or this key (--max-sessions-per-key) has no room for
        another session."""
        limit = self.settings.max_sessions
        if len(self.sessions) >= limit:
            raise overloaded(f"The gateway has its maximum of {limit} sessions open; retry later.", SESSION_RETRY_S)
        per_key = self.settings.max_sessions_per_key
        if sum(1 for owner in self.sessions.values() if owner == key_id) >= per_key:
            raise ApiError(
                "too_many_sessions",
                f"This key has its maximum of {per_key} sessions open; close one or retry later.",
                type="rate_limit_error",
                status=429,
                retry_after_s=SESSION_RETRY_S,
            )

    def open_session(self, session: RealtimeSession, principal: Principal) -> Attachment:
        """Count a new session in and spend the client secret that opened it, all or nothing. Nothing
        here awaits, so concurrent requests cannot pass a bound between the check and the count. Returns
        the opening transport's hold on the session."""
        self.check_session_room(principal.key_id)
        self.auth.spend(principal)
        self.sessions[session] = principal.key_id
        return self.hub.add(session, principal.key_id)

    async def open_storage(self) -> None:
        url = self.settings.database_url or sqlite_url(self.settings.data_dir)
        engine = await open_database(url)
        self.conversations = ConversationStore(engine)
        self.durable = DurableState(engine)
        snapshot = await self.durable.load(self.settings.idempotency_ttl_s)
        self.auth.restore(snapshot.secrets)
        self.idempotency.restore(snapshot.idempotency)
        self.limiter.restore(snapshot.buckets)
        self.auth.journal = self.idempotency.journal = self.limiter.journal = self.durable

    @property
    def store(self) -> ConversationStore:
        if self.conversations is None:  # only before the lifespan started: requests come after it
            raise ApiError("storage_unavailable", "The conversation store is not open.", type="server_error", status=503)
        return self.conversations

    async def end_session(self, session: RealtimeSession) -> None:
        """The session is over: uncounted, unresumable, closed, and its WebRTC call (if any) hung up."""
        self.sessions.pop(session, None)
        self.hub.remove(session)
        await session.close()
        for call in list(self.calls.values()):
            if call.session is session:
                call.ended.set()  # the call's supervisor closes the peer connection

    def require_model(self, model: str, param: str = "model") -> None:
        if model not in self.runtime.model_names:
            raise ApiError(
                "model_not_found",
                f"The model '{model}' does not exist. Available: '{self.settings.model_name}'.",
                param,
                status=404,
            )

    def require_ready(self) -> None:
        runtime = self.runtime
        if runtime.load_error:
            raise ApiError("model_load_failed", f"The models failed to load: {runtime.load_error}", type="server_error", status=503)
        if not runtime.ready.is_set() or runtime.engine is None:
            raise ApiError("model_not_ready", "The models are still loading; retry shortly.", type="server_error", status=503, retry_after_s=2.0)
