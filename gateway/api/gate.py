"""A request's way in: who calls (keys and client secrets), how often (requests per minute), with how many tokens
(per minute) and the answers kept for a retry (Idempotency-Key). caller.py hands a handler the authorized caller."""

from __future__ import annotations

from dataclasses import dataclass

from gateway.platform.auth import Authenticator, Principal
from gateway.platform.config import Settings
from gateway.platform.idempotency import IdempotencyStore
from gateway.platform.ratelimit import RateLimiter
from gateway.platform.redis_state import RedisState
from gateway.platform.storage.durable_state import DurableState, Snapshot
from gateway.platform.token_quota import TokenQuota


@dataclass(frozen=True)
class Caller:
    """An authenticated, rate-limited caller."""

    principal: Principal
    headers: dict[str, str]  # the rate-limit headers its answer carries

    @property
    def key_id(self) -> str:
        return self.principal.key_id


@dataclass
class Gate:
    auth: Authenticator
    limiter: RateLimiter
    quota: TokenQuota  # tokens per minute per key, in the limiter's buckets
    idempotency: IdempotencyStore

    @classmethod
    def create(cls, settings: Settings) -> Gate:
        limiter = RateLimiter(settings.rate_limit_rpm)
        return cls(auth=Authenticator(list(settings.api_keys), max_secrets_per_key=settings.max_client_secrets_per_key),
                   limiter=limiter, quota=TokenQuota(settings.rate_limit_tpm, limiter),
                   idempotency=IdempotencyStore(settings.idempotency_ttl_s))

    async def authorize(self, token: str | None, *, allow_ephemeral: bool = False) -> Caller:
        """Authenticate and rate-limit one request (401, 429); a client secret only where `allow_ephemeral`."""
        principal = await self.auth.authenticate(token, allow_ephemeral=allow_ephemeral)
        return Caller(principal, await self.limiter.check(principal.key_id))

    def share(self, shared: RedisState) -> None:
        """--redis-url: secrets, idempotent answers and buckets live in Redis, for every replica."""
        self.auth.shared = self.idempotency.shared = self.limiter.shared = shared

    def restore(self, snapshot: Snapshot, journal: DurableState) -> None:
        """One replica: its state as the database kept it, and every change written behind it from now on."""
        self.auth.restore(snapshot.secrets)
        self.idempotency.restore(snapshot.idempotency)
        self.limiter.restore(snapshot.buckets)
        self.auth.journal = self.idempotency.journal = self.limiter.journal = journal
