"""What the HTTP and WebSocket handlers share: settings, models, auth, limits and live sessions."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from gateway.auth import Authenticator, Principal, bearer_token
from gateway.config import Settings
from gateway.idempotency import IdempotencyStore
from gateway.protocol.errors import ApiError
from gateway.ratelimit import RateLimiter
from gateway.runtime import Runtime

if TYPE_CHECKING:
    from gateway.session import RealtimeSession
    from gateway.transports.webrtc import Call


@dataclass
class Services:
    settings: Settings
    runtime: Runtime
    auth: Authenticator
    limiter: RateLimiter
    idempotency: IdempotencyStore
    sessions: set[RealtimeSession] = field(default_factory=set)
    calls: dict[str, Call] = field(default_factory=dict)  # live WebRTC calls by id
    # Tasks that outlive a request (WebRTC calls); cancelled and awaited at shutdown.
    background: set[asyncio.Task[None]] = field(default_factory=set)

    @classmethod
    def create(cls, settings: Settings, runtime: Runtime | None = None) -> Services:
        return cls(
            settings=settings,
            runtime=runtime or Runtime(settings),
            auth=Authenticator(list(settings.api_keys)),
            limiter=RateLimiter(settings.rate_limit_rpm),
            idempotency=IdempotencyStore(settings.idempotency_ttl_s),
        )

    def authorize(self, authorization: str | None, *, allow_ephemeral: bool = False) -> tuple[Principal, dict[str, str]]:
        """Authenticate and rate-limit one request; returns the caller and the rate-limit headers."""
        principal = self.auth.authenticate(bearer_token(authorization), allow_ephemeral=allow_ephemeral)
        return principal, self.limiter.check(principal.key_id)

    def require_model(self, model: str, param: str = "model") -> None:
        if model != self.settings.model_name:
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
