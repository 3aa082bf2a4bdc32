"""How many intra-op threads the scheduler thread uses: adaptive, because the CPU is shared.

Measured on this 2-vCPU machine (real steps alternated between 1 and 2 threads, same run):
- other core free: 2 threads are ~1.7x faster for one decoding stream (one core does not saturate the
  memory bandwidth), ~1.8x for a batch of 8 and ~1.8x for a 256-token prefill chunk;
- other core partly busy: 2 threads still win (step time x0.6-0.8);
- both cores kept busy by other threads (ASR/TTS in the same process, other processes): every OpenMP
  parallel region waits for a descheduled team thread, and 2 threads ran up to 10-17x *slower* than 1
  (a decoding step took 0.65-1.2 s instead of ~70 ms).

While Whisper or Piper runs (``inference.cpu``), a step uses only the cores they leave free, and
such steps do not count for the policy below.

A step ahead of its listeners (every row a spoken reply's decode whose audio plays on for a while:
``StepPlan.ahead``) is not waited for, so it runs on the thread count that costs the fewest core-seconds a
step by the costs measured so far (threads x seconds: one thread unless N were measured more than N
times faster), leaving the other cores to Whisper, Piper and other sessions.

Policy, per kind of step (single decode / decode batch / prefill):
- run with the current choice and keep a running cost of its steps;
- every ``EXPLORE_EVERY`` steps of that kind, run one step with the other choice; switch when it was
  clearly cheaper (paired in time with the steps around it, so the machine's load is about the same);
  while exploring keeps clearly losing, the wait doubles, up to ``EXPLORE_EVERY_MAX`` steps;
- a cheap probe (the same small matmul with 1 and with N threads, back to back, at most once per
  ``interval_s``) detects the pathological case; while its running average says N threads are
  several times slower, N is neither used nor explored, so exploring never costs a one-second step;
  once it no longer does, the kinds it put on one thread return to N.

``torch.set_num_threads`` on the scheduler thread changes that thread's OpenMP/MKL setting only (both
are per thread); it also becomes the default of threads that start using torch afterwards.

One multi-threaded OpenMP team per process: libgomp keeps a pool of worker threads for every thread
that ever ran a parallel region, until that thread exits. Once the pools hold more threads than there
are cores, every barrier sleeps instead of spinning ("throttled"): the GEMMs of a decoding step then
took 38 ms with 2 threads, as long as with 1, against 21 ms with 2 threads and no other pool. So only
the scheduler thread runs torch with several threads; re-laying the weights runs under
:func:`one_intra_op_thread`, and other torch work runs on a thread that exits afterwards
(:func:`run_in_own_thread`) or with one thread.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any, TypeVar

import torch

from inference.cpu import cores_in_use

T = TypeVar("T")


async def run_in_own_thread(fn: Callable[..., T], *args: Any) -> T:
    """Run ``fn(*args)`` on a new thread that exits afterwards, so any OpenMP pool it made goes too
    (a thread of the event loop's default executor lives on, and so would its pool)."""
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="own-thread") as executor:
        return await asyncio.get_running_loop().run_in_executor(executor, fn, *args)


@contextmanager
def one_intra_op_thread() -> Iterator[None]:
    """Run the torch work of the block on this thread with one intra-op thread (no OpenMP pool)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)

KINDS = ("decode", "batch", "prefill")


class _Kind:
    __slots__ = ("cost", "steps", "next_explore", "explore_every")

    def __init__(self, explore_every: int) -> None:
        self.cost: dict[int, float] = {}
        self.steps = 0
        self.next_explore = 8
        self.explore_every = explore_every


class ThreadPolicy:
    EXPLORE_EVERY = 24
    # An exploration that loses clearly doubles the wait for the next one, up to this: a step of 8
    # rows on one thread took 6-7 ms more than on two (15.7 vs 9.8 ms at 70 tokens, 17.6 vs 10.6 at
    # 200), so exploring every 24 steps cost 8 streams ~2.5%.
    EXPLORE_EVERY_MAX = 384
    CLEAR_LOSS = 1.3  # an exploration this much dearer than the current choice "clearly loses"
    SWITCH_GAIN = 0.88  # switch when the other choice costs < 88% of the current one
    PATHOLOGICAL = 2.0  # probe: N threads this many times slower than 1 -> never use or explore N

    def __init__(self, max_threads: int = 0, *, fixed: int = 0, interval_s: float = 1.0,
                 probe_weight: torch.Tensor | None = None) -> None:
        self.max_threads = max(1, int(max_threads or torch.get_num_threads()))
        self.fixed = int(fixed)
        self.interval_s = interval_s
        self.ratio = 0.5  # EWMA of probe t(N threads) / t(1 thread)
        self.probes = 0
        self.switches = 0
        self.yielded_steps = 0  # steps run on fewer threads while other model work held cores
        self.ahead_steps = 0  # steps ahead of their listeners, run on the threads that cost fewest core-seconds
        self._use = {k: (self.fixed if self.fixed > 0 else self.max_threads) for k in KINDS}
        self._forced: set[str] = set()  # kinds put on one thread by a pathological probe
        self._kinds = {k: _Kind(self.EXPLORE_EVERY) for k in KINDS}
        self._current = 0
        self._next_probe = 0.0
        self._x: torch.Tensor | None = None
        self._w = probe_weight
        self._last: tuple[str, int, bool] | None = None

    @property
    def adaptive(self) -> bool:
        return self.fixed <= 0 and self.max_threads > 1

    @staticmethod
    def kind(rows: int) -> str:
        if rows <= 2:
            return "decode"
        return "batch" if rows <= 32 else "prefill"

    def _set(self, n: int) -> None:
        if n != self._current:
            torch.set_num_threads(n)
            self._current = n

    # -- probe ------------------------------------------------------------------------------------------
    def _measure(self) -> tuple[float, float]:
        """Seconds for the probe with 1 thread and with ``max_threads`` threads, back to back."""
        if self._w is None:
            self._w = torch.randn(576, 3072)
        if self._x is None or self._x.dtype != self._w.dtype or self._x.device != self._w.device:
            self._x = torch.randn(64, self._w.shape[0], dtype=self._w.dtype, device=self._w.device)
        times = []
        for n in (1, self.max_threads):
            self._set(n)
            if self.probes == 0:
                # A thread's first parallel region starts its OpenMP team: 2 threads then measured 1.4-2.5x
                # slower than 1, and a new engine ran on one thread until later probes outvoted it.
                torch.mm(self._x, self._w)
            t = time.perf_counter()
            torch.mm(self._x, self._w)
            torch.mm(self._x, self._w)
            times.append(time.perf_counter() - t)
        return times[0], times[1]

    def _probe(self) -> None:
        t1, tn = self._measure()
        sample = tn / max(t1, 1e-9)
        # The average starts from the prior (N threads pay off), so one probe alone condemns N threads
        # only when it is far out: a new engine's first probe, taken while the process was still busy
        # elsewhere, had measured 2.5-4x, and every kind of step then ran on one thread (100 instead
        # of 185 tok/s) until exploring won it back, for prefill steps a long while.
        self.ratio = 0.5 * self.ratio + 0.5 * sample
        self.probes += 1
        if self.pathological:
            for k in KINDS:
                if self._use[k] != 1:
                    self._use[k] = 1
                    self._forced.add(k)
                    self.switches += 1
        elif self._forced:
            # Contention has passed: the kinds it forced down return to N threads (exploring still
            # decides from there).
            for k in self._forced:
                self._use[k] = self.max_threads
                self.switches += 1
            self._forced.clear()

    @property
    def pathological(self) -> bool:
        return self.ratio > self.PATHOLOGICAL

    # -- steps ------------------------------------------------------------------------------------------
    def before_step(self, rows: int = 1, *, ahead: bool = False) -> int:
        """Apply (and return) the thread count for a step of ``rows`` new tokens; ``ahead``: no reader waits for
        the step (see the module's docstring)."""
        if not self.adaptive:
            n = self.fixed if self.fixed > 0 else 1
            self._set(n)
            return n
        if ahead and not cores_in_use():
            self.ahead_steps += 1
            kind = self.kind(rows)
            cost = self._kinds[kind].cost
            many = self.max_threads
            n = many if many in cost and 1 in cost and many * cost[many] < cost[1] else 1
            self._last = (kind, n, False)  # its time keeps that choice's cost current
            self._set(n)
            return n
        busy = cores_in_use()
        if busy:
            # Whisper or Piper is running: leave their cores alone. Not recorded: it says nothing
            # about which choice is cheaper when the cores are free.
            self.yielded_steps += 1
            self._last = None
            n = max(1, min(self._use[self.kind(rows)], self.max_threads - busy))
            self._set(n)
            return n
        now = time.monotonic()
        if now >= self._next_probe:
            self._probe()
            self._next_probe = now + self.interval_s
        kind = self.kind(rows)
        k = self._kinds[kind]
        k.steps += 1
        n = self._use[kind]
        exploring = False
        if k.steps >= k.next_explore and n in k.cost:
            other = 1 if n != 1 else self.max_threads
            if not (other != 1 and self.pathological):
                n, exploring = other, True
            k.next_explore = k.steps + k.explore_every
        self._last = (kind, n, exploring)
        self._set(n)
        return n

    def after_step(self, rows: int, seconds: float) -> None:
        """Record the cost of the step just run (per row, so steps of one kind compare)."""
        if self._last is None:
            return
        kind, n, exploring = self._last
        self._last = None
        k = self._kinds[kind]
        cost = seconds / max(1, rows) if kind == "prefill" else seconds / (1.0 + rows / 16.0)
        if exploring:
            current = self._use[kind]
            k.cost[n] = cost
            if cost < self.SWITCH_GAIN * k.cost.get(current, float("inf")):
                self._use[kind] = n
                self.switches += 1
                k.explore_every = self.EXPLORE_EVERY
            elif cost > self.CLEAR_LOSS * k.cost.get(current, 0.0):
                k.explore_every = min(2 * k.explore_every, self.EXPLORE_EVERY_MAX)
            else:
                k.explore_every = self.EXPLORE_EVERY
            k.next_explore = k.steps + k.explore_every
        else:
            old = k.cost.get(n)
            k.cost[n] = cost if old is None else 0.7 * old + 0.3 * cost

    def snapshot(self) -> dict[str, float]:
        out: dict[str, float] = {
            "threads_max": self.max_threads,
            "threads_current": self._current,
            "threads_probe_ratio": round(self.ratio, 3),
            "threads_probes": self.probes,
            "threads_switches": self.switches,
            "threads_yielded_steps": self.yielded_steps,
            "threads_ahead_steps": self.ahead_steps,
        }
        for kind in KINDS:
            out[f"threads_{kind}"] = self._use[kind]
        return out
