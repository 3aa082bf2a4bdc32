"""Tokens per minute per API key (--rate-limit-tpm), input plus output, beside requests per minute.

As OpenAI counts them: a request reserves its prompt's tokens plus the most it may generate (`max_tokens`) before
it runs, and gives back what it did not generate when it ends. A request whose reservation the bucket cannot
cover gets 429 `rate_limit_exceeded` (type `tokens`) with `Retry-After` and OpenAI's x-ratelimit-*-tokens
headers; one larger than the whole minute's allowance can never run, and says so. The bucket is the rate
limiter's (ratelimit.py): in this process and its database, or in Redis for every replica.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from gateway.platform.ratelimit import RateLimiter
from gateway.protocol.errors import ApiError
from inference.llm.backend import GenerationResult


@dataclass
class Reservation:
    quota: TokenQuota
    caller: str
    prompt_tokens: int
    reserved: int  # prompt plus max_tokens
    remaining: float  # the bucket after the reservation (after the settlement, once settled)
    settled: bool = False

    def headers(self) -> dict[str, str]:
        return self.quota.headers(self.remaining)

    def rate_limit(self) -> dict[str, object]:
        """The tokens entry of a Realtime `rate_limits.updated` event."""
        return {"name": "tokens", "limit": self.quota.tokens_per_minute, "remaining": max(0, math.floor(self.remaining)),
                "reset_seconds": round(self.quota.reset_s(self.remaining), 3)}

    async def settle(self, result: GenerationResult | None, streamed: int = 0) -> None:
        """The request ended: what its reservation did not use goes back. `result`: its generation's (its prompt
        may have grown, with a second round after a memory was saved); None when it has none (failed, or
        cancelled), and then `streamed` deltas count as its output."""
        if self.settled:
            return
        self.settled = True
        prompt, output = (result.prompt_tokens, result.completion_tokens) if result is not None else (0, streamed)
        unused = self.reserved - max(self.prompt_tokens, prompt) - max(0, output)
        if unused > 0:
            _, self.remaining = await self.quota.take(self.caller, -unused)


class TokenQuota:
    def __init__(self, tokens_per_minute: int, limiter: RateLimiter) -> None:
        self.tokens_per_minute = tokens_per_minute  # 0: unlimited
        self.limiter = limiter

    def __bool__(self) -> bool:
        return self.tokens_per_minute > 0

    @property
    def _rate(self) -> float:
        return self.tokens_per_minute / 60.0

    def reset_s(self, remaining: float) -> float:
        return max(0.0, (self.tokens_per_minute - remaining) / self._rate)

    def headers(self, remaining: float) -> dict[str, str]:
        return {"x-ratelimit-limit-tokens": str(self.tokens_per_minute),
                "x-ratelimit-remaining-tokens": str(max(0, math.floor(remaining))),
                "x-ratelimit-reset-tokens": f"{self.reset_s(remaining):.3f}s"}

    async def take(self, caller: str, cost: float) -> tuple[bool, float]:
        return await self.limiter.take(f"tokens:{caller}", float(self.tokens_per_minute), self._rate, cost)

    async def reserve(self, caller: str, prompt_tokens: int, max_tokens: int) -> Reservation | None:
        """None when there is no token limit; 429 when the bucket cannot cover the request now."""
        if not self:
            return None
        cost = prompt_tokens + max_tokens
        if cost > self.tokens_per_minute:
            raise ApiError("rate_limit_exceeded", f"Request too large: {prompt_tokens} prompt tokens plus up to "
                           f"{max_tokens} output tokens is {cost}, over the limit of {self.tokens_per_minute} tokens "
                           "per minute. Send fewer tokens or a smaller max_tokens.", type="tokens", status=429,
                           headers={"x-ratelimit-limit-tokens": str(self.tokens_per_minute)})
        taken, remaining = await self.take(caller, cost)
        if not taken:
            wait = (cost - remaining) / self._rate
            headers = {**self.headers(remaining), "x-ratelimit-reset-tokens": f"{wait:.3f}s"}
            raise ApiError("rate_limit_exceeded", f"Rate limit of {self.tokens_per_minute} tokens per minute reached: "
                           f"this request needs {cost} ({prompt_tokens} prompt tokens plus max_tokens), "
                           f"{math.floor(remaining)} are left; retry in {wait:.1f} s.", type="tokens", status=429,
                           retry_after_s=wait, headers=headers)
        return Reservation(self, caller, prompt_tokens, cost, remaining)


@dataclass
class TokenAccount:
    """One key's share of the quota, as a Realtime session draws on it."""

    quota: TokenQuota
    caller: str

    async def reserve(self, prompt_tokens: int, max_tokens: int) -> Reservation | None:
        return await self.quota.reserve(self.caller, prompt_tokens, max_tokens)
