"""How many intra-op threads the scheduler thread gives each step: adaptive, because the CPU is shared.

Measured on this 2-vCPU machine (benchmarks/engine_options.py):
- when the other core is free, 2 threads prefill ~1.5x faster and decode a batch of 8 ~1.4x faster;
  one decoding stream runs at the same speed with 1 or 2 threads (it is memory-bound);
- when the other core is busy (ASR and TTS in the same process, other processes), libgomp's
  spin-waiting barriers make 2 threads 5-10x *slower* than 1 (unless OMP_WAIT_POLICY=PASSIVE is set
  before torch is imported).
So each kind of step keeps a running estimate of its cost with 1 and with N threads, uses the cheaper,
and now and then re-tries the other (less often while it keeps losing). ``torch.set_num_threads`` on
the scheduler thread only changes that thread's OpenMP setting, not the rest of the process.
"""

from __future__ import annotations

import torch


class _Arm:
    __slots__ = ("cost", "samples")

    def __init__(self) -> None:
        self.cost = 0.0
        self.samples = 0

    def update(self, value: float, alpha: float = 0.3) -> None:
        self.cost = value if self.samples == 0 else (1 - alpha) * self.cost + alpha * value
        self.samples += 1


class _Bucket:
    __slots__ = ("arms", "steps", "explore_every", "next_explore")

    def __init__(self, choices: tuple[int, ...]) -> None:
        self.arms = {c: _Arm() for c in choices}
        self.steps = 0
        self.explore_every = 16
        self.next_explore = 16


class ThreadPolicy:
    """Chooses 1 or ``max_threads`` intra-op threads per step, from measured step costs."""

    MIN_EXPLORE, MAX_EXPLORE = 16, 512

    def __init__(self, max_threads: int = 0, *, fixed: int = 0) -> None:
        self.max_threads = max(1, int(max_threads or torch.get_num_threads()))
        self.fixed = int(fixed)
        choices = (1, self.max_threads) if self.max_threads > 1 else (1,)
        self._buckets = {k: _Bucket(choices) for k in ("decode", "batch", "prefill")}
        self._current = 0
        self._last: tuple[str, int] | None = None
        self._exploring = False

    @staticmethod
    def _kind(rows: int) -> str:
        if rows <= 2:
            return "decode"
        if rows <= 32:
            return "batch"
        return "prefill"

    def before_step(self, rows: int) -> int:
        """Pick and apply the thread count for a step of ``rows`` new tokens."""
        self._exploring = False
        if self.fixed > 0:
            n = self.fixed
        else:
            kind = self._kind(rows)
            b = self._buckets[kind]
            b.steps += 1
            untried = [c for c, a in b.arms.items() if a.samples < 2]
            if untried:
                n = untried[0]
            else:
                n = min(b.arms, key=lambda c: b.arms[c].cost)
                if b.steps >= b.next_explore and len(b.arms) > 1:
                    n = next(c for c in b.arms if c != n)
                    b.next_explore = b.steps + b.explore_every
                    self._exploring = True
            self._last = (kind, n)
        if n != self._current:
            torch.set_num_threads(n)
            self._current = n
        return n

    def after_step(self, rows: int, seconds: float) -> None:
        """Record the cost of the step just run (per row for prefill, per row-weighted step otherwise)."""
        if self.fixed > 0 or self._last is None:
            return
        kind, n = self._last
        self._last = None
        b = self._buckets[kind]
        cost = seconds / rows if kind == "prefill" else seconds / (1.0 + rows / 16.0)
        b.arms[n].update(cost, alpha=0.7 if self._exploring else 0.3)
        if self._exploring:
            best = min(b.arms, key=lambda c: b.arms[c].cost)
            if best == n:
                b.explore_every = self.MIN_EXPLORE  # conditions changed: keep checking the other one
            else:
                b.explore_every = min(self.MAX_EXPLORE, b.explore_every * 2)  # lost again: look less often

    def snapshot(self) -> dict[str, float]:
        out: dict[str, float] = {"threads_max": self.max_threads, "threads_current": self._current}
        for kind, b in self._buckets.items():
            for c, a in b.arms.items():
                out[f"threads_{kind}_{c}_cost_ms"] = round(a.cost * 1000, 3)
        return out
