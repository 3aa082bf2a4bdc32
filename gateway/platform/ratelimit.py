"""Requests per minute per caller, as a token bucket, with OpenAI's x-ratelimit-* headers; the buckets of
tokens per minute (token_quota.py) live here too."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from gateway.protocol.errors import ApiError

if TYPE_CHECKING:
    from gateway.platform.redis_state import RedisState
    from gateway.platform.storage.durable_state import DurableState
    from gateway.platform.storage.schema import RateLimitRow


@dataclass
class _Bucket:
    tokens: float
    updated: float


@dataclass
class RateLimiter:
    requests_per_minute: int  # 0: unlimited
    _buckets: dict[str, _Bucket] = field(default_factory=dict)
    journal: DurableState | None = None  # writes the buckets behind us: a restart does not refill them
    shared: RedisState | None = None  # --redis-url: one bucket per key for every replica

    def restore(self, rows: list[RateLimitRow]) -> None:
        for row in rows:
            self._buckets[row.owner] = _Bucket(tokens=row.tokens, updated=row.updated_at)

    async def check(self, caller: str) -> dict[str, str]:
        """Take one request from the caller's bucket; returns headers, or raises 429."""
        if self.requests_per_minute <= 0:
            return {}
        capacity = float(self.requests_per_minute)
        rate = capacity / 60.0
        if self.shared is not None:
            taken, tokens = await self.shared.take_tokens(f"requests:{caller}", capacity, rate)
        else:
            taken, tokens = self._take(caller, capacity, rate, 1.0)
        if not taken:
            wait = (1.0 - tokens) / rate
            error = ApiError(
                "rate_limit_exceeded",
                f"Rate limit of {self.requests_per_minute} requests per minute reached; retry in {wait:.1f} s.",
                type="requests",
                status=429,
                retry_after_s=wait,
                headers={
                    "x-ratelimit-limit-requests": str(self.requests_per_minute),
                    "x-ratelimit-remaining-requests": "0",
                    "x-ratelimit-reset-requests": f"{wait:.3f}s",
                },
            )
            raise error
        reset = (capacity - tokens) / rate
        return {
            "x-ratelimit-limit-requests": str(self.requests_per_minute),
            "x-ratelimit-remaining-requests": str(math.floor(tokens)),
            "x-ratelimit-reset-requests": f"{reset:.3f}s",
        }

    async def take(self, bucket: str, capacity: float, rate: float, cost: float) -> tuple[bool, float]:
        """Take `cost` from a bucket of `capacity` refilled at `rate` per second (a negative cost gives back):
        whether it was taken, and what is left. In Redis with --redis-url, for every replica."""
        if self.shared is not None:
            return await self.shared.take_tokens(bucket, capacity, rate, cost)
        return self._take(bucket, capacity, rate, cost)

    def _take(self, caller: str, capacity: float, rate: float, cost: float) -> tuple[bool, float]:
        now = time.time()  # wall clock: buckets outlive the process
        bucket = self._buckets.setdefault(caller, _Bucket(tokens=capacity, updated=now))
        bucket.tokens = min(capacity, bucket.tokens + (now - bucket.updated) * rate)
        bucket.updated = now
        if bucket.tokens < cost:
            return False, bucket.tokens
        bucket.tokens = min(capacity, bucket.tokens - cost)
        if self.journal is not None:
            self.journal.bucket(caller, bucket.tokens, bucket.updated)
        return True, bucket.tokens
