"""Executes a step plan on the model and samples its rows (vLLM v1's ``gpu_model_runner.py`` seam):
:meth:`ModelRunner.execute_model` takes a :class:`~.step_plan.StepPlan` and returns a
:class:`~.step_plan.StepOutput`, a token (or an error) per sampling row and the requests whose forward failed.

Two ways to run the rows of a plan:

- **Eager**: one ragged forward over every row (``LeanForward.forward``). On a CPU this is the
  engine's C kernels (or torch's), where per-call overhead is small next to the arithmetic.
- **Static decode**: the decoding rows run through :meth:`LeanForward.decode_static` over
  fixed-size input buffers, padded up to a *batch bucket* (1, 2, 4, 8, 16, 24, 32, ...) and a
  *length bucket* (a power of two); prompt chunks still run eagerly beside them. On CUDA each
  (batch, length) bucket is captured once as a CUDA graph over those buffers and replayed: one
  launch a step instead of a few hundred, which is what bounds a small model's decoding on a GPU.
  The same buffers, padding and slot mapping run without capture on a CPU (tests force it), so
  everything but the capture itself is tested where there is no GPU.

Row ``i`` of a static step is slot ``i`` of the pool (the KV manager keeps slots compact), so a step
whose decoding slots are ``{0, 3}`` runs bucket 4; rows 1, 2 and 3-onwards padding. A padding row reads
one position of its slot (finite: the pool is zero-filled on CUDA, sanitized on a CPU) and writes
its key and value to the pool's scratch slot; its logits are dropped.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import torch

from .device_sampler import ALL_FLAGS, DeviceSampler, SampleFlags
from .forward import LeanForward
from .kv_manager import KVManager
from .request import Request
from .sampling import RowSampler, sample_rows
from .step_plan import StepOutput, StepPlan, leading_decodes

log = logging.getLogger(__name__)

MIN_LENGTH_BUCKET = 64


def batch_buckets(max_batch: int) -> tuple[int, ...]:
    """1, 2, 4, 8, then steps of 8 up to ``max_batch`` (always included): padding costs at most
    half of a small batch and 7 rows of a large one, and 32 slots need 7 graphs per length."""
    out = [b for b in (1, 2, 4) if b < max_batch]
    b = 8
    while b < max_batch:
        out.append(b)
        b += 8
    out.append(max_batch)
    return tuple(out)


def bucket_for(n: int, buckets: tuple[int, ...]) -> int:
    for b in buckets:
        if b >= n:
            return b
    raise ValueError(f"{n} rows exceed the largest bucket ({buckets[-1]})")


def length_bucket(n: int, capacity: int) -> int:
    """The smallest power of two >= ``n`` (at least MIN_LENGTH_BUCKET), at most the pool's capacity."""
    b = MIN_LENGTH_BUCKET
    while b < n:
        b *= 2
    return min(b, capacity)


def length_buckets(upto: int, capacity: int) -> list[int]:
    """Every length bucket a context of up to ``upto`` positions falls in."""
    out = [length_bucket(1, capacity)]
    while out[-1] < min(upto, capacity):
        out.append(length_bucket(out[-1] + 1, capacity))
    return out


@dataclass(frozen=True)
class _Views:
    ids: torch.Tensor
    positions: torch.Tensor
    write_slots: torch.Tensor
    seq_lens: torch.Tensor
    take: torch.Tensor
    state_rows: torch.Tensor
    logits: torch.Tensor


@dataclass
class _Graph:
    graph: torch.cuda.CUDAGraph
    out: torch.Tensor  # the captured step's output buffer


MAX_LISTED_FAILURES = 8


@dataclass
class CaptureReport:
    """What capturing the decode step's graphs gave and cost (in the log, ``/healthz``'s ``llm`` and
    ``stats()``): a bucket whose capture failed runs uncaptured, slower, and must not do so silently."""

    captured: int = 0
    failed: int = 0
    seconds: float = 0.0  # spent capturing (the warm-up run before each capture included)
    # Memory the captures added: torch's caching allocator's (the graphs' private pool), and the device's
    # as the driver counts it (the graphs' own objects too; another process or model loading meanwhile
    # counts in it as well).
    memory_bytes: int = 0
    device_memory_bytes: int = 0
    failures: list[str] = field(default_factory=list)  # "<rows>x<positions>: reason", the first few

    def as_dict(self) -> dict[str, Any]:
        return {"captured": self.captured, "failed": self.failed, "capture_s": round(self.seconds, 3),
                "memory_mib": round(self.memory_bytes / 2**20, 1),
                "device_memory_mib": round(self.device_memory_bytes / 2**20, 1), "failures": list(self.failures)}


class ModelRunner:
    def __init__(self, fwd: LeanForward, kv: KVManager, *, static_decode: bool | None = None,
                 capture: bool | None = None) -> None:
        """``static_decode``: run decoding rows over the static buffers (default: on CUDA, where the
        forward attends on sdpa), and sample their greedy and temperature rows on the device
        (``sampler``). ``capture``: capture both as CUDA graphs (default: on CUDA)."""
        on_cuda = fwd.device.type == "cuda"
        if static_decode is None:
            static_decode = on_cuda and fwd.decode_attention == "sdpa"
        if static_decode and fwd.decode_attention != "sdpa":
            raise ValueError("static decoding runs on sdpa; this forward attends on the engine's kernels")
        if capture is None:
            capture = static_decode and on_cuda
        if capture and not (on_cuda and static_decode):
            raise ValueError("CUDA graphs need a CUDA device and static decoding")
        if static_decode and not kv.pool.fixed and capture:
            raise ValueError("CUDA graphs need a fixed KV pool (its address is captured)")
        self.fwd = fwd
        self.kv = kv
        self.static_decode = static_decode
        self.capture = capture
        self.buckets = batch_buckets(kv.pool.slots)
        n = self.buckets[-1]
        dev = fwd.device
        # The static input buffers, rows of one tensor: every graph reads their first B entries. Row 4
        # holds the decoding rows' logits to return, in the plan's order; row 5 each row's state row in
        # the device sampler (its scratch row for padding).
        self._inputs = torch.zeros((6, n), dtype=torch.long, device=dev)
        self._ids, self._positions, self._write_slots, self._seq_lens, self._take, self._state_rows = self._inputs
        self._seq_lens.fill_(1)
        self.sampler: DeviceSampler | None = None
        self._logits = torch.empty(0)
        if static_decode:
            self.sampler = DeviceSampler(n, kv.pool.max_capacity + 1, fwd.vocab_size, dev)
            self._state_rows.fill_(self.sampler.scratch)
            # Every forward graph of a batch bucket writes its logits here, where the sampler's graph reads them.
            self._logits = torch.zeros((n, fwd.vocab_size), dtype=fwd.logits_dtype, device=dev)
        # Host staging, filled through numpy: one copy of the whole buffer to the device a step (contiguous,
        # so it is one asynchronous copy from pinned memory; a slice's rows would be copied through
        # temporaries). The next step waits for it before writing here again (the copy of the sampled ids
        # back usually has already).
        pin = on_cuda
        self._host = torch.zeros((6, n), dtype=torch.long, pin_memory=pin)
        self._host_np = self._host.numpy()
        self._copied = torch.cuda.Event() if on_cuda else None
        self.input_copies = 0  # host-to-device copies of the static path's inputs (one a step)
        self._graphs: dict[tuple[int, int], _Graph] = {}
        self._uncapturable: set[tuple[int, int]] = set()
        # The sampler's step per batch bucket and flags, captured with the rest by capture_all only (a
        # capture's warm-up runs the step: here, only over the scratch row).
        self._sample_graphs: dict[tuple[int, SampleFlags], _Graph] = {}
        self._take_is_prefix = True  # the last static step's wanted rows are its first slots, in order
        self._views: dict[int, _Views] = {}
        self._graph_pool = torch.cuda.graph_pool_handle() if capture else None
        self._pool_generation = kv.pool.generation
        self.graph_replays = 0
        self.padded_rows = 0
        self.capture_report = CaptureReport()

    def describe(self) -> dict[str, Any]:
        if not self.static_decode:
            return {"decode": "eager"}
        out: dict[str, Any] = {"decode": "cuda-graphs" if self.capture else "static",
                               "batch_buckets": ",".join(map(str, self.buckets))}
        if self.capture:
            out["cuda_graphs"] = self.capture_report.as_dict()
        return out

    def stats(self) -> dict[str, float]:
        report = self.capture_report
        return {"cuda_graphs": len(self._graphs) + len(self._sample_graphs), "cuda_graph_failures": report.failed,
                "cuda_graph_capture_seconds": report.seconds, "cuda_graph_memory_bytes": report.memory_bytes,
                "cuda_graph_device_memory_bytes": report.device_memory_bytes,
                "graph_replays": self.graph_replays, "padded_rows": self.padded_rows}

    def capture_all(self, max_length: int) -> int:
        """Capture every batch bucket over every length bucket up to ``max_length`` (before any request
        runs: the warm-up before each capture computes rows whose writes go to the scratch slot), and
        log what that gave and cost (``capture_report``). Returns the graphs captured."""
        if not self.capture:
            return 0
        pool = self.kv.pool
        self._write_slots.fill_(pool.scratch_slot)
        self._seq_lens.fill_(1)
        self._ids.zero_()
        self._positions.zero_()
        lengths = length_buckets(max_length, pool.capacity)
        assert self.sampler is not None
        self._state_rows.fill_(self.sampler.scratch)
        for B in reversed(self.buckets):  # the largest first: the others reuse its memory pool
            for L in lengths:
                self._graph_for(B, L)
            for flags in ALL_FLAGS:
                self._captured(f"{B}x{flags_name(flags)}", partial(self._capture_sampling, B, flags))
        r = self.capture_report
        log.info("captured %d CUDA graphs of the decode step (%d batch x %d length buckets, up to %d positions) and "
                 "of its sampling (%d batch buckets x %d flags) in %.2f s, using %.0f MiB of GPU memory (%.0f MiB on "
                 "the device)%s", r.captured, len(self.buckets), len(lengths), lengths[-1], len(self.buckets),
                 len(ALL_FLAGS), r.seconds, r.memory_bytes / 2**20, r.device_memory_bytes / 2**20,
                 f"; {r.failed} failed and run uncaptured" if r.failed else "")
        return len(self._graphs) + len(self._sample_graphs)

    def padding_step(self, B: int, L: int) -> tuple[Callable[[], torch.Tensor], bool]:
        """Bucket ``(B, L)``'s decoding step for a measurement, while no request runs: every row reads
        ``L`` positions of its slot and writes only the scratch slot. Returns a function that runs it
        (the graph's replay where this bucket is captured, else the same step uncaptured) and whether
        it replays a graph. (``benchmarks/gpu.py`` times it against the engine's own step.)"""
        if not self.static_decode:
            raise ValueError("the static decode path is off (an eager runner has no buckets)")
        B = bucket_for(B, self.buckets)
        pool = self.kv.pool
        pool.ensure_capacity(L)
        for slot in range(B):
            pool.sanitize(slot, L)
        self._ids[:B].zero_()
        self._positions[:B].fill_(L - 1)
        self._write_slots[:B].fill_(pool.scratch_slot)
        self._seq_lens[:B].fill_(L)
        graph = self._graph_for(B, L) if self.capture else None
        if graph is not None:
            def replay() -> torch.Tensor:
                graph.graph.replay()
                return graph.out
            return replay, True
        data = pool.data
        assert data is not None
        args = (data, self._ids[:B], self._positions[:B], self._write_slots[:B], self._seq_lens[:B], L,
                self._logits[:B])
        return lambda: self.fwd.decode_static(*args), False

    def _memory_in_use(self) -> tuple[int, int]:
        """GPU memory in use on the forward's device: torch's caching allocator's (reserved), and the
        device's as the driver counts it; zeros off CUDA."""
        dev = self.fwd.device
        if dev.type != "cuda":
            return 0, 0
        free, total = torch.cuda.mem_get_info(dev)
        return torch.cuda.memory_reserved(dev), total - free

    # -- a step ----------------------------------------------------------------------------------------
    def execute_model(self, plan: StepPlan) -> StepOutput:
        """Run ``plan`` and sample one token for each of its sampling rows. A step whose rows all sample on
        the device (``StepPlan.device_sampled``) samples there, and where that raises, runs again with its
        rows sampled apart. If the batched pass raises, each request runs alone to find the culprit
        (:meth:`execute_each`): the culprits are ``failed``, the others go on."""
        t0 = time.perf_counter()
        if self.sampler is not None and plan.device_sampled:
            try:
                ids = self.execute_sampled(plan)
            except Exception:
                log.exception("a step sampled on the device failed; running it again with its rows sampled apart")
                t0 = time.perf_counter()
            else:
                return StepOutput(list(plan.sampling), ids.tolist(), forward_seconds=time.perf_counter() - t0)
        failed: dict[int, tuple[Request, Exception]] = {}
        try:
            # No synchronization with a GPU here: the step's one wait is the copy of the sampled ids back
            # (sampling.py), which comes after the work queued behind the forward.
            logits = self.execute(plan)
        except Exception as exc:
            if len(plan.segments) == 1:
                log.exception("forward failed for %s", plan.requests[0].id)
                return StepOutput([], [], {id(plan.requests[0]): (plan.requests[0], exc)}, time.perf_counter() - t0)
            log.exception("batched forward failed; retrying requests one by one")
            logits, failed = self.execute_each(plan)
        seconds = time.perf_counter() - t0
        sampling = [r for r in plan.sampling if id(r) not in failed]
        tokens = sample_rows(logits, [r.sampler for r in sampling], self.sampler) if sampling else []  # type: ignore[misc]
        return StepOutput(sampling, tokens, failed, seconds)

    def execute(self, plan: StepPlan, sampled: torch.Tensor | None = None) -> torch.Tensor:
        """The logits of ``plan.logit_rows``, in that order (``fwd.logits_dtype``): on the static path its
        decoding rows' lie in a buffer the next step writes again. A step that raises may be run again,
        whole or a request at a time (the engine's fallback): each row writes its KV at its own
        position, and a slot's length only grows to what was written. ``sampled``: the decoding rows'
        input ids as the previous step left them on the device, in the plan's row order (a step launched
        before the host has those tokens: overlap.py); the plan's own ids are then placeholders."""
        pool = self.kv.pool
        if sampled is not None and not self._all_decode(plan):
            raise ValueError("ids from the device feed decoding rows on the static path only")
        self.kv.reserve(plan.end)
        dev = self.fwd.device
        if not self.static_decode:
            return self.fwd.forward(pool, torch.tensor(plan.token_ids, dtype=torch.long, device=dev),
                                    torch.tensor(plan.positions, dtype=torch.long, device=dev),
                                    plan.segments, plan.logit_rows)
        n_dec = leading_decodes(plan.segments)
        pieces = []
        if n_dec:
            wanted_dec = [r for r in plan.logit_rows if r < n_dec]
            full, k = self._decode(plan, n_dec, wanted_dec, sampled)
            if wanted_dec:
                pieces.append(self._taken(full, k))
        if n_dec < len(plan.segments):
            local = [r - n_dec for r in plan.logit_rows if r >= n_dec]
            # The prompt rows' ids and positions in one copy to the device.
            rows = torch.tensor([plan.token_ids[n_dec:], plan.positions[n_dec:]], dtype=torch.long).to(dev)
            pieces.append(self.fwd.forward(pool, rows[0], rows[1], plan.segments[n_dec:], local))
        if not pieces:
            return torch.empty((0, self.fwd.vocab_size), dtype=self.fwd.logits_dtype, device=dev)
        return pieces[0] if len(pieces) == 1 else torch.cat(pieces)

    def _all_decode(self, plan: StepPlan) -> bool:
        return (self.static_decode and plan.rows == len(plan.segments) == len(plan.logit_rows)
                and list(plan.logit_rows) == list(range(plan.rows)))

    def execute_sampled(self, plan: StepPlan, sampled: torch.Tensor | None = None) -> torch.Tensor:
        """A step whose rows all decode and sample on the device (``StepPlan.device_sampled``): the
        forward, then the sampler's step over its logits, each one graph's replay where captured. Returns
        the rows' ids on the device, in the plan's order, without waiting for them. ``sampled``: as for
        :meth:`execute`."""
        sampler = self.sampler
        samplers: list[RowSampler] = [r.sampler for r in plan.sampling]  # type: ignore[misc]
        if sampler is None or not self._all_decode(plan) or len(samplers) != plan.rows:
            raise ValueError("sampling on the device takes decoding rows on the static path, one sampler each")
        try:
            flags = sampler.prepare(samplers)
            self.kv.reserve(plan.end)
            state_rows = [row for s in samplers if (row := s.mask_row) is not None]  # prepare gave each one
            full, k = self._decode(plan, plan.rows, list(range(plan.rows)), sampled, state_rows)
            B = full.shape[0]
            graph = self._sample_graphs.get((B, flags)) if self.capture else None
            if graph is not None:
                graph.graph.replay()
                self.graph_replays += 1
                ids = graph.out
            else:
                width = max(sampler.fill[r] for r in state_rows)
                ids = sampler.run(full, self._views[B].state_rows, width, flags)
        except Exception:
            sampler.invalidate(samplers)  # their rows may hold a token the host does not count
            raise
        sampler.advance_host(samplers)
        return self._taken(ids, k)

    def _taken(self, rows: torch.Tensor, k: int) -> torch.Tensor:
        """The last static step's rows (slot order) that the plan wants, in its order (``_take[:k]``)."""
        if self._take_is_prefix:
            return rows if rows.shape[0] == k else rows[:k]
        return rows.index_select(0, self._views[k].take if k in self._views else self._take[:k])

    def execute_each(self, plan: StepPlan) -> tuple[torch.Tensor, dict[int, tuple[Request, Exception]]]:
        """After ``plan``'s batched pass raised: each request's part of it alone, to find the culprit
        (nothing is committed before a pass completes, so running a segment again is safe). Returns the
        logits of the requests that ran, in the plan's order, and the others' errors by ``id(request)``."""
        failed: dict[int, tuple[Request, Exception]] = {}
        pieces = []
        for index, req in enumerate(plan.requests):
            alone = plan.alone(index)
            try:
                out = self.execute(alone)
                if alone.logit_rows:
                    pieces.append(out.clone())  # the next request's step writes the static path's buffer again
            except Exception as error:
                failed[id(req)] = (req, error)
        dev = self.fwd.device
        logits = torch.cat(pieces) if pieces else torch.empty((0, self.fwd.vocab_size), device=dev)
        return logits, failed

    def _decode(self, plan: StepPlan, n_dec: int, wanted: list[int], sampled: torch.Tensor | None = None,
                state_rows: list[int] | None = None) -> tuple[torch.Tensor, int]:
        """The single-token rows of ``plan`` on the static path: the logits of the whole batch bucket, in
        slot order, and how many of its rows ``wanted`` (indices into its first ``n_dec``) picks (their
        slots, in that order, are ``_take``: :meth:`_taken`). The inputs are staged on the host in numpy
        and reach the device in one copy, with the rows to return and each row's ``state_rows`` (its row
        in the device sampler). ``sampled`` (every row's id, on the device) is then scattered to the rows'
        slots."""
        pool = self.kv.pool
        segs = plan.segments[:n_dec]
        slots = [seg.slot for seg in segs]
        starts = [seg.start for seg in segs]
        B = bucket_for(max(slots) + 1, self.buckets)
        L = length_bucket(max(starts) + 1, pool.capacity)
        # Staged in Python lists and written to numpy in one assignment: numpy's own indexing costs a few
        # microseconds a call, more than these few dozen integers.
        ids, positions, write_slots, lengths = [0] * B, [0] * B, [pool.scratch_slot] * B, [1] * B
        rows = [self.sampler.scratch if self.sampler is not None else 0] * B
        token_ids = plan.token_ids
        for j, slot in enumerate(slots):
            ids[slot] = token_ids[j]
            positions[slot] = starts[j]
            write_slots[slot] = slot
            lengths[slot] = starts[j] + 1
        if state_rows is not None:
            for j, slot in enumerate(slots):
                rows[slot] = state_rows[j]
        take = [slots[w] for w in wanted]
        k = len(take)
        self._take_is_prefix = take == list(range(k))
        if self._copied is not None:
            self._copied.synchronize()  # the last step's copy has read the buffer
        self._host_np[:, :B] = (ids, positions, write_slots, lengths, take + [0] * (B - k), rows)
        self._inputs.copy_(self._host, non_blocking=True)
        if self._copied is not None:
            self._copied.record()
        views = self._views.get(B) or self._views_of(B)
        if sampled is not None:  # every row is wanted: _take[:k] holds the rows' slots in order
            self._ids.index_copy_(0, (self._views.get(k) or self._views_of(k)).take, sampled)
        self.input_copies += 1
        clean = pool.clean
        for slot in range(B):  # every position a row reads must be finite (a no-op on a zero-filled pool)
            if clean[slot] < L:
                pool.sanitize(slot, L)
        self.padded_rows += B - n_dec
        assert pool.data is not None
        graph = self._graph_for(B, L) if self.capture else None
        if graph is not None:
            graph.graph.replay()
            self.graph_replays += 1
            logits = graph.out
        else:
            logits = self.fwd.decode_static(pool.data, views.ids, views.positions, views.write_slots, views.seq_lens,
                                            L, views.logits)
        for seg in segs:
            pool.commit(seg.slot, seg.start + 1)
        return logits, k

    def _views_of(self, B: int) -> _Views:
        """The static buffers' first ``B`` rows (a slice costs the host a microsecond or two each step)."""
        self._views[B] = _Views(self._ids[:B], self._positions[:B], self._write_slots[:B], self._seq_lens[:B],
                                self._take[:B], self._state_rows[:B], self._logits[:B])
        return self._views[B]

    def _graph_for(self, B: int, L: int) -> _Graph | None:
        """The captured step for this bucket, captured now if it is not yet; None where its capture
        failed (that bucket then runs the same step uncaptured: slower, never wrong)."""
        pool = self.kv.pool
        if pool.generation != self._pool_generation:  # pragma: no cover - a fixed pool never moves
            self._graphs.clear()
            self._pool_generation = pool.generation
        found = self._graphs.get((B, L))
        if found is not None or (B, L) in self._uncapturable:
            return found
        found = self._captured(f"{B}x{L}", lambda: self._capture(B, L))
        if found is None:
            self._uncapturable.add((B, L))
        return found

    def _captured(self, name: str, capture: Callable[[], _Graph]) -> _Graph | None:
        """``capture()``'s graph, its time and memory in ``capture_report``; None, with a warning and its
        reason there, where it failed (that step then runs uncaptured: slower, never wrong)."""
        report = self.capture_report
        t0, before = time.perf_counter(), self._memory_in_use()
        found = None
        try:
            found = capture()
        except Exception as exc:
            reason = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
            log.warning("capturing the decoding step %s failed (%s); it runs uncaptured", name, reason)
            report.failed += 1
            if len(report.failures) < MAX_LISTED_FAILURES:
                report.failures.append(f"{name}: {reason}")
        else:
            report.captured += 1
        finally:
            report.seconds += time.perf_counter() - t0
            after = self._memory_in_use()
            report.memory_bytes += after[0] - before[0]
            report.device_memory_bytes += after[1] - before[1]
        return found

    def _graph_of(self, step: Callable[[], torch.Tensor]) -> _Graph:
        """``step`` captured, by torch's recipe: warmed up on a side stream (kernel selection, allocations),
        then captured. The warm-up runs the step: it must be one whose running twice is harmless."""
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            step()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        # thread_local: the ASR and TTS models may use the GPU from their own threads meanwhile.
        with torch.cuda.graph(graph, pool=self._graph_pool, capture_error_mode="thread_local"):
            out = step()
        return _Graph(graph, out)

    def _capture(self, B: int, L: int) -> _Graph:
        pool = self.kv.pool
        assert pool.data is not None
        # The warm-up computes this very step, so its KV writes are the ones the replay makes again.
        args = (pool.data, self._ids[:B], self._positions[:B], self._write_slots[:B], self._seq_lens[:B], L,
                self._logits[:B])
        captured = self._graph_of(lambda: self.fwd.decode_static(*args))
        self._graphs[(B, L)] = captured
        log.debug("captured the decode step for %d rows over %d positions", B, L)
        return captured

    def _capture_sampling(self, B: int, flags: SampleFlags) -> _Graph:
        """The sampler's step over bucket ``B``'s logits, over its whole width (any row's ids fit). Only
        while every row points at the scratch row (capture_all): the warm-up samples and appends."""
        sampler = self.sampler
        assert sampler is not None
        captured = self._graph_of(lambda: sampler.run(self._logits[:B], self._state_rows[:B], sampler.width, flags))
        self._sample_graphs[(B, flags)] = captured
        return captured


def flags_name(flags: SampleFlags) -> str:
    return "+".join(name for name, on in flags._asdict().items() if on) or "greedy"
