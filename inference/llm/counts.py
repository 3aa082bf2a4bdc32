"""The engine's counters: written by the scheduler thread only, read by anyone (``LLMEngine.stats``)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class EngineCounts:
    steps: int = 0
    step_rows: int = 0  # requests in the steps, summed: / steps is the average batch
    tokens_generated: int = 0
    prefill_tokens: int = 0
    requests_finished: int = 0
    requests_cancelled: int = 0
    requests_failed: int = 0
    requests_rejected: int = 0
    step_seconds: float = 0.0
    exclusive_wait_seconds: float = 0.0
    paced_wait_seconds: float = 0.0
    last_cancel_free_s: float = 0.0  # from a running request's cancel to its slot's release
    avg_request_s: float = 2.0  # a moving average of requests' time from submission to their end

    def as_stats(self) -> dict[str, float]:
        steps = self.steps
        return {
            "steps": steps, "tokens_generated": self.tokens_generated, "prefill_tokens": self.prefill_tokens,
            "requests_finished": self.requests_finished, "requests_cancelled": self.requests_cancelled,
            "requests_failed": self.requests_failed, "requests_rejected": self.requests_rejected,
            "step_seconds_total": self.step_seconds,
            "avg_step_ms": (self.step_seconds / steps * 1000.0) if steps else 0.0,
            "avg_batch_size": (self.step_rows / steps) if steps else 0.0,  # requests per step
            "last_cancel_free_ms": self.last_cancel_free_s * 1000.0,
            "exclusive_wait_seconds_total": self.exclusive_wait_seconds,
            "paced_wait_seconds_total": self.paced_wait_seconds,
        }
