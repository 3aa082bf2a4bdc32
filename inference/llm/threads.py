"""How many intra-op threads the scheduler thread uses: adaptive, because the CPU is shared.

Measured on this 2-vCPU machine (steps alternated 1/2 threads, same run):
- when the other core is free, 2 threads are ~1.7x faster for one decoding stream (one core does not
  saturate memory bandwidth), ~1.8x for a batch of 8 and ~1.8x for a 256-token prefill chunk;
- when other threads keep both cores busy (ASR/TTS in the same process, other processes), every
  OpenMP parallel region waits for a descheduled team thread while libgomp's barrier spins: 2 threads
  then ran 5-10x *slower* than 1 (a decoding step took 0.5-2 s instead of 50-80 ms). Setting
  ``OMP_WAIT_POLICY=PASSIVE`` before torch is imported removes most of that (2 threads ~= 1 thread).

So the policy probes, at most every ``interval_s`` while the engine is busy, the same small matmul with
1 and with N threads back to back (a paired comparison under the same load; ~2 ms when the machine is
quiet) and keeps a running ratio; it uses N threads while N is clearly faster, else 1.

``torch.set_num_threads`` on the scheduler thread changes that thread's OpenMP/MKL setting only (both
are per thread); it also becomes the default of threads that start using torch afterwards.
"""

from __future__ import annotations

import time

import torch


class ThreadPolicy:
    def __init__(self, max_threads: int = 0, *, fixed: int = 0, interval_s: float = 1.0,
                 probe_weight: torch.Tensor | None = None) -> None:
        self.max_threads = max(1, int(max_threads or torch.get_num_threads()))
        self.fixed = int(fixed)
        self.interval_s = interval_s
        self.ratio = 0.5  # EWMA of t(N threads) / t(1 thread) on the probe; < 1: N threads help
        self.probes = 0
        self.switches = 0
        self._use = self.fixed if self.fixed > 0 else self.max_threads
        self._current = 0
        self._next_probe = 0.0
        self._x: torch.Tensor | None = None
        self._w = probe_weight

    @property
    def adaptive(self) -> bool:
        return self.fixed <= 0 and self.max_threads > 1

    def _set(self, n: int) -> None:
        if n != self._current:
            torch.set_num_threads(n)
            self._current = n

    def _measure(self) -> tuple[float, float]:
        """Seconds for the probe with 1 thread and with ``max_threads`` threads, back to back."""
        if self._w is None:
            self._w = torch.randn(576, 3072)
        if self._x is None or self._x.dtype != self._w.dtype or self._x.device != self._w.device:
            self._x = torch.randn(64, self._w.shape[0], dtype=self._w.dtype, device=self._w.device)
        times = []
        for n in (1, self.max_threads):
            torch.set_num_threads(n)
            self._current = n
            t = time.perf_counter()
            torch.mm(self._x, self._w)
            torch.mm(self._x, self._w)
            times.append(time.perf_counter() - t)
        return times[0], times[1]

    def _probe(self) -> None:
        t1, tn = self._measure()
        sample = tn / max(t1, 1e-9)
        self.ratio = sample if self.probes == 0 else 0.5 * self.ratio + 0.5 * sample
        self.probes += 1
        # Hysteresis: leave N threads when they stop paying off, come back once they clearly do.
        use = self._use
        if use > 1 and self.ratio > 0.95:
            use = 1
        elif use == 1 and self.ratio < 0.8:
            use = self.max_threads
        if use != self._use:
            self.switches += 1
            self._use = use

    def before_step(self, rows: int = 0) -> int:
        """Apply (and return) the thread count for the next step."""
        if self.adaptive:
            now = time.monotonic()
            if now >= self._next_probe:
                self._probe()
                self._next_probe = now + self.interval_s
        self._set(self._use)
        return self._use

    def after_step(self, rows: int, seconds: float) -> None:  # kept for symmetry; the probe decides
        return None

    def snapshot(self) -> dict[str, float]:
        return {
            "threads_max": self.max_threads,
            "threads_current": self._use,
            "threads_probe_ratio": round(self.ratio, 3),
            "threads_probes": self.probes,
            "threads_switches": self.switches,
        }
