"""One LLM engine for all sessions: continuous batching, shared prefix KV cache, conversation cache,
early prefill, cancellation and backpressure.

Its parts, along vLLM v1's seams: :class:`~.intake.Intake` checks a request and builds it; the
:class:`~.scheduler.Scheduler` admits requests, returns a step plan and takes the sampled tokens
(``update_from_output``); the :class:`~.kv_manager.KVManager` hands out KV slots and holds the prefix
cache and the conversations' pins; the :class:`~.model_runner.ModelRunner` executes a plan and samples
its rows (CUDA graphs on a GPU); :class:`~.delivery.Deliveries` carries the results to the event loops.
This module owns the scheduler thread and its step, in one shape: schedule, execute (the runner samples),
update from its output, deliver; with overlap, its own step function beside the plain one.

Threads: the event loop calls :meth:`LLMEngine.submit` / :meth:`LLMEngine.prefill` (non-blocking: they
only enqueue); one scheduler thread owns the model, the KV buffers and the prefix cache. Every step it

1. drops cancelled requests and admits queued ones up to ``max_batch_size`` (prefix-cache lookup:
   the longest cached prefix of the prompt is copied into the request's own KV buffer). A request
   whose prompt shares a long prefix with one still being prefilled waits in the queue until that KV
   is in the cache, so requests arriving together with one system prompt compute it once;
2. builds one ragged batch: one token per decoding request plus prompt chunks of prefilling requests
   (at most ``prefill_chunk_tokens`` prompt tokens per step, so a long prompt never stalls the others);
3. has the model runner run one forward pass (:mod:`.forward`) and sample one token for every row that
   needs it (:mod:`.sampling`), and hands text deltas to the event loop with ``call_soon_threadsafe``. On the
   static path (a GPU's), a step whose rows all sample on the device may be launched before the host
   has read the previous step's tokens, which it accepts while the device computes (:mod:`.overlap`).

A request that finishes (any reason) leaves the KV of its prompt + generated tokens in the prefix cache.
With a ``conversation_id`` that KV is also pinned for the conversation until its next request or
:meth:`LLMEngine.end_conversation`, which drops what only that conversation used (shared prefixes stay). Reuse is always by token content (longest common prefix), so a
truncated conversation reuses exactly the KV of the kept tokens and recomputes the rest.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch

from inference.cpu import charge, wait_for_exclusive_work, wait_for_idle_cores

from .backend import DEFAULT_SAMPLING, EngineClosed, EngineOverloaded, FinishReason, GenerationStream, SamplingParams
from .constraints import TokenConstraint
from .conversation_ops import ConversationOps
from .counts import EngineCounts
from .delivery import Deliveries
from .finishing import Finisher
from .forward import LeanForward
from .intake import Intake
from .kv_manager import KVManager
from .loader import LoadedLM
from .model_runner import ModelRunner
from .overlap import InFlight, StepOverlap
from .request import Request
from .scheduler import Scheduler
from .step_plan import StepOutput, StepPlan
from .threads import ThreadPolicy

log = logging.getLogger(__name__)

# The longest the scheduler gives way to exclusive work (inference/cpu.py) before stepping anyway.
EXCLUSIVE_WAIT_MAX_S = 1.0
# How long a paced engine waits on Whisper or Piper before it looks at its queue again: a new reply waits
# at most this long for its first step (a step itself takes 5-20 ms here).
PACED_POLL_S = 0.02
# CUDA graphs captured when the engine starts: every batch bucket over contexts up to this length;
# longer length buckets are captured when first needed.
GRAPH_LENGTH_AT_START = 4096
# The share of the GPU's free memory a fixed KV pool may take (the rest: activations, graphs, cache).
FIXED_POOL_MEMORY_SHARE = 0.5


def fixed_pool_tokens(fwd: LeanForward, slots: int, prefix_cache_bytes: int) -> int:
    """Positions per slot of a pool allocated once on a GPU: the context window, or what
    FIXED_POOL_MEMORY_SHARE of the free memory (less the prefix cache's budget) holds."""
    free, _ = torch.cuda.mem_get_info(fwd.device)
    budget = int(free * FIXED_POOL_MEMORY_SHARE) - max(0, prefix_cache_bytes)
    return max(256, budget // ((slots + 1) * fwd.kv_bytes_per_token()))


@dataclass(frozen=True)
class EngineConfig:
    max_batch_size: int = 16
    max_queued_requests: int = 64
    prefill_chunk_tokens: int = 256
    prefix_cache_bytes: int = 1 << 30
    # Additions. Intra-op threads of the scheduler thread: 0 = adaptive between 1 and torch's thread
    # count (see threads.py: measured per kind of step, because the CPU is shared); > 0 = fixed.
    threads: int = 0
    # Decoding rows over static, bucketed buffers (model_runner.py): None = on CUDA. CUDA graphs are
    # captured over them where the device is CUDA; elsewhere they run without capture (tests).
    static_decode: bool | None = None
    # Launch a decoding step before the host has read the previous one's tokens (overlap.py): None = where
    # the static path runs on a GPU (a CPU computes the step on the host's own cores: nothing to overlap).
    overlap_steps: bool | None = None


class LLMEngine:
    def __init__(self, lm: LoadedLM, config: EngineConfig = EngineConfig()) -> None:
        if config.max_batch_size < 1 or config.max_queued_requests < 1 or config.prefill_chunk_tokens < 1:
            raise ValueError(f"invalid engine config: {config}")
        self.lm = lm
        self.config = config
        self.fwd = LeanForward.for_model(lm.model, lm.context_window, lm.weight_format, kernel_dir=lm.cache_dir,
                                         kernels=lm.kernels, gguf=lm.gguf if lm.weight_format == "gguf" else None)
        on_cpu = self.fwd.device.type == "cpu"
        static = config.static_decode if config.static_decode is not None else (
            not on_cpu and self.fwd.decode_attention == "sdpa")
        # A captured graph holds the pool's address: on CUDA the pool is allocated once, whole, as long
        # as the context window where memory allows, and the engine's window is what it holds.
        fixed = static and not on_cpu
        window = lm.context_window
        if fixed:
            window = min(window, fixed_pool_tokens(self.fwd, config.max_batch_size, config.prefix_cache_bytes))
        self.context_window = window
        self.kv = KVManager(self.fwd.kv_layout, config.max_batch_size, max_capacity=window,
                            prefix_cache_bytes=config.prefix_cache_bytes, fixed_pool=fixed)
        self.runner = ModelRunner(self.fwd, self.kv, static_decode=static)
        overlap = config.overlap_steps if config.overlap_steps is not None else static and not on_cpu
        if overlap and not static:
            raise ValueError("overlapped steps run on the static decode path")
        self._overlap = StepOverlap(self.fwd.device, config.max_batch_size) if overlap else None
        self._in_flight: InFlight | None = None  # the scheduler thread's
        self.threads = ThreadPolicy(torch.get_num_threads(), fixed=config.threads if on_cpu else 1,
                                    probe_weight=self.fwd.layers[0].gu[0] if self.fwd.weight_format == "native"
                                    else None)
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self.scheduler = Scheduler(self.kv, max_batch_size=config.max_batch_size,
                                   prefill_chunk_tokens=config.prefill_chunk_tokens, lock=self._lock)
        self.intake = Intake(lm.tokenizer, vocab=self.fwd.vocab_size, context_window=window,
                             eos_ids=lm.eos_token_ids, device=self.fwd.device)
        self._conversations = ConversationOps(self.kv, self.scheduler, self._lock)
        self._deliveries = Deliveries()
        self.counts = EngineCounts()  # written by the scheduler thread, read anywhere
        self._ends = Finisher(self.kv, self.runner.sampler, self._conversations, self._deliveries, self.counts)
        self._thread: threading.Thread | None = None
        self._running = False
        self._closed = False
        # Called with each step's batch size on the scheduler thread (the gateway's histogram); must not block.
        self.step_observer: Callable[[int], None] | None = None

    # -- lifecycle ------------------------------------------------------------------------------------
    def start(self) -> None:
        with self._lock:
            if self._closed:
                raise EngineClosed("engine is closed")
            if self._thread is not None:
                return
            self._running = True
            self._thread = threading.Thread(target=self._run, name="llm-engine", daemon=True)
            self._thread.start()

    def close(self, timeout: float = 10.0) -> None:
        with self._cond:
            if self._closed and self._thread is None:
                return
            self._closed = True
            self._running = False
            for r in self.scheduler.requests():
                r.cancel_requested = True
            self._cond.notify_all()
        t = self._thread
        if t is not None:
            t.join(timeout)
            if t.is_alive():  # it finishes its requests itself when its step returns
                log.warning("LLM engine thread did not stop within %.1f s", timeout)
                return
            self._thread = None
        else:
            self._finish_leftovers()  # never started: nothing else touches the requests

    def _finish_leftovers(self) -> None:
        for r in self.scheduler.take_all():
            self._ends.finish(r, "cancelled")

    def __enter__(self) -> LLMEngine:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- the event loop's side: non-blocking, they only enqueue ---------------------------------------------
    def _enqueue(self, req: Request) -> None:
        with self._cond:
            if self._closed:
                raise EngineClosed("engine is closed")
            if self.scheduler.queued >= self.config.max_queued_requests:
                self.counts.requests_rejected += 1
                per_slot = self.counts.avg_request_s / max(1, self.config.max_batch_size)
                raise EngineOverloaded(float(min(30.0, max(0.5, per_slot * (self.scheduler.queued + 1)))))
            self.scheduler.add(req)
            self._cond.notify_all()

    def awaiting_first_token(self) -> bool:
        """Whether a live request that samples still waits for its first token (queued, or in its prefill)."""
        with self._lock:
            requests = self.scheduler.requests()
        return any(r.generates and not r.background and r.first_token_at is None for r in requests)

    def submit(
        self, prompt_ids: Sequence[int], params: SamplingParams = DEFAULT_SAMPLING, *,
        conversation_id: str | None = None, constraint: TokenConstraint | None = None, background: bool = False,
        messages: Sequence[Mapping[str, Any]] | None = None,
    ) -> GenerationStream:
        """Queue a generation; returns at once. Raises EngineOverloaded / EngineClosed / ValueError.
        (``messages`` is for backends that template on their side; this one runs the ids.)

        `constraint`: a fresh grammar state (constraints.py) that decides which tokens it may sample.
        `background`: work nobody waits on (a title): it never delays a live request (see Scheduler.admit)."""
        loop = asyncio.get_running_loop()
        req = self.intake.generation(prompt_ids, params, loop, conversation_id=conversation_id,
                                     constraint=constraint, background=background)
        req.stream = GenerationStream(req.id, loop, on_cancel=lambda: self._cancel(req),
                                      on_pace=lambda until: setattr(req, "not_needed_before", until),
                                      so_far=lambda: req.result("cancelled", time.monotonic()))
        self._enqueue(req)
        return req.stream

    def prefill(
        self, prompt_ids: Sequence[int], *, conversation_id: str, background: bool = False,
        messages: Sequence[Mapping[str, Any]] | None = None,
    ) -> asyncio.Future[int]:
        """Compute (and pin for the conversation) the KV of ``prompt_ids`` ahead of the request.

        Resolves to the number of tokens whose KV this call computed (0 when all were cached).
        Cancelling the returned future cancels the prefill. `background`: as in submit (a pre-warm).
        """
        loop = asyncio.get_running_loop()
        req = self.intake.prefill(prompt_ids, loop, conversation_id=conversation_id, background=background)
        fut: asyncio.Future[int] = loop.create_future()
        req.future = fut
        fut.add_done_callback(lambda f: self._cancel(req) if f.cancelled() else None)
        self._enqueue(req)
        return fut

    def _cancel(self, req: Request) -> None:
        """A stream's cancel (any thread): the request stops at the next step boundary."""
        req.cancel_at = time.monotonic()
        req.cancel_requested = True
        with self._cond:
            self._cond.notify_all()

    def end_conversation(self, conversation_id: str) -> None:
        """The conversation is over (its session closed): unpin its KV and drop the part no other
        sequence shares, which nobody will ask for again (it had filled the cache's budget with dead
        conversations and evicted shared prefixes instead). A request of it still running caches
        nothing when it stops."""
        self._ask_conversations("end", conversation_id)

    def clear_prefix_cache(self) -> None:
        """Drop every cached prefix (pins included) at the next step boundary."""
        self._ask_conversations("clear")

    def _ask_conversations(self, op: Literal["end", "clear"], conversation_id: str = "") -> None:
        with self._cond:
            self._conversations.ask(op, conversation_id)
            self._cond.notify_all()
        if self._thread is None:
            self._conversations.apply()

    def describe(self) -> dict[str, Any]:
        out = {"backend": "in-process", **self.fwd.describe(), **self.runner.describe()}
        if self.runner.static_decode:
            out["overlap"] = "on" if self._overlap is not None else "off"  # overlap.py
        return out

    def stats(self) -> dict[str, float]:
        return {**self.kv.stats(), **self.threads.snapshot(), **self.runner.stats(), **self.counts.as_stats(),
                "queue_depth": self.scheduler.queued, "active": self.scheduler.active,
                "requests_waited_for_shared_prefix": self.scheduler.requests_waited_for_prefix,
                "decode_rows_paced": self.scheduler.rows_paced,
                "steps_overlapped": self._overlap.steps if self._overlap is not None else 0,
                "overlapped_accept_seconds_total": self._overlap.accept_seconds if self._overlap is not None else 0.0}

    # -- scheduler thread ----------------------------------------------------------------------------------
    def _run(self) -> None:
        torch.set_grad_enabled(False)
        if self.fwd.device.type != "cpu":
            self.threads = ThreadPolicy(1, fixed=max(1, self.config.threads or torch.get_num_threads()))
        if self.runner.capture:
            # Before any request: a capture mid-reply would stall every stream of that step. The runner
            # logs the graphs, the time and the memory they took, and warns of each bucket that failed.
            self.runner.capture_all(GRAPH_LENGTH_AT_START)
        while True:
            with self._cond:
                while (self._running and not self.scheduler.queued and not self.scheduler.active
                       and not self._conversations.pending):
                    self._cond.wait()
                if not self._running:
                    break
            try:
                self._conversations.apply()
                for r in self.scheduler.drop_cancelled():
                    self._ends.finish(r, "cancelled")
                self._admit()
                if self.scheduler.active and not self._give_way():
                    with self._deliveries.step():
                        self._step()
                elif self._in_flight is not None:  # no step follows it now: its tokens go out
                    with self._deliveries.step():
                        self._accept_in_flight()
            except Exception as exc:  # a bug, not a bad request: fail what is running, keep serving
                log.exception("LLM engine step failed")
                self._in_flight = None
                for r in self.scheduler.take_running():
                    self._ends.fail(r, exc)
        self._in_flight = None  # its requests end below
        self._finish_leftovers()
        log.debug("LLM engine thread stopped")

    def _give_way(self) -> bool:
        """On a CPU, let work that needs every core (a reply's first clause in Piper) have them (inference/cpu.py);
        then, while every reply is ahead of its listener and Whisper or Piper runs, wait a little for them (new
        work and cancels are looked at again after it), until they end or a reply is due. True: no step now."""
        if self.fwd.device.type != "cpu":
            return False
        self.counts.exclusive_wait_seconds += wait_for_exclusive_work(EXCLUSIVE_WAIT_MAX_S)
        now = time.monotonic()
        due = self.scheduler.paced_until(now)
        if due is None:
            return False
        waited = wait_for_idle_cores(min(due - now, PACED_POLL_S))
        self.counts.paced_wait_seconds += waited
        return waited > 0.0

    def _admit(self) -> None:
        for admitted in self.scheduler.admit():
            req = admitted.request
            if admitted.error is not None:
                log.error("admission of %s failed: %r", req.id, admitted.error)
                self._ends.fail(req, admitted.error)
            elif admitted.complete:
                self._ends.finish(req, "stop")

    def _step(self) -> None:
        """One step in one shape: schedule, execute (the runner samples), update from its output, deliver
        (``_run``'s ``Deliveries.step`` sends what it gathered). With overlap, its own step function."""
        t0 = time.perf_counter()
        if self._overlap is not None:
            self._overlapped_step(self._overlap)
        else:
            self._plain_step()
        self.counts.step_seconds += time.perf_counter() - t0

    def _plain_step(self) -> None:
        """A step whose tokens the host reads and accepts before the next one is planned."""
        plan = self.scheduler.schedule()
        if plan is not None:
            self._update_from_output(plan, self._execute_model(plan))

    def _overlapped_step(self, overlap: StepOverlap) -> None:
        """A step launched before the host has read the one in flight, where it may follow it (overlap.py);
        else the step in flight is accepted and the next one planned: launched to be in flight where
        every row samples on the device, run as a plain step otherwise."""
        if self._in_flight is not None and self._step_ahead(overlap):
            return
        plan = self.scheduler.schedule()
        if plan is None:
            return
        if plan.device_sampled:
            try:
                self._in_flight = self._launch(overlap, plan, None)
                return
            except Exception:
                log.exception("a step launched to overlap failed; running it again as a plain step")
        self._update_from_output(plan, self._execute_model(plan))

    def _step_ahead(self, overlap: StepOverlap) -> bool:
        """Launch the step after the one in flight before accepting that one's tokens, if it may follow
        it (StepOverlap.next_plan); else accept them first. True: a step was launched. (A launch that
        raises fails the running requests, as a failed step does: its KV may be written past the tokens
        the host has, which no plan can take up again.)"""
        prev = self._in_flight
        assert prev is not None
        self._in_flight = None
        plan = overlap.next_plan(prev, self.scheduler.active, time.monotonic())
        launched = self._launch(overlap, plan, prev.ids) if plan is not None else None
        t1 = time.perf_counter()
        self._accept_step(prev.plan.sampling, prev.tokens())
        if launched is None:
            return False
        overlap.steps += 1
        overlap.accept_seconds += time.perf_counter() - t1
        if all(r.finished for r in launched.plan.requests):  # each ended at the step before: nothing to accept
            self._accept_step(launched.plan.sampling, [])
        else:
            self._in_flight = launched
        return True

    def _launch(self, overlap: StepOverlap, plan: StepPlan, sampled: torch.Tensor | None) -> InFlight:
        """Run ``plan`` (its input ids ``sampled`` on the device, where given) and sample its rows on the
        device, leaving the ids there."""
        threads = self.threads.before_step(plan.rows, ahead=plan.ahead)
        t0 = time.perf_counter()
        ids = self.runner.execute_sampled(plan, sampled)
        self._ran(plan, threads, time.perf_counter() - t0)
        self._count_step(plan)
        return overlap.in_flight(plan, ids)

    def _execute_model(self, plan: StepPlan) -> StepOutput:
        """The runner's execution of ``plan`` (its forward and its sampling) on the threads the policy gives a
        step of its rows."""
        threads = self.threads.before_step(plan.rows, ahead=plan.ahead)
        out = self.runner.execute_model(plan)
        self._ran(plan, threads, out.forward_seconds)
        return out

    def _ran(self, plan: StepPlan, threads: int, seconds: float) -> None:
        """A step's forward took ``seconds`` on ``threads``: the policy learns it and, on a CPU, the LLM's account
        of CPU-seconds is charged."""
        self.threads.after_step(plan.rows, seconds)
        if self.fwd.device.type == "cpu":
            charge("llm", threads * seconds)

    def _accept_in_flight(self) -> None:
        prev, self._in_flight = self._in_flight, None
        if prev is not None:
            self._accept_step(prev.plan.sampling, prev.tokens())

    def _count_step(self, plan: StepPlan) -> None:
        counts = self.counts
        counts.steps += 1
        counts.step_rows += len(plan.requests)
        if self.step_observer is not None:
            self.step_observer(len(plan.requests))
        counts.prefill_tokens += plan.prefill_tokens

    def _update_from_output(self, plan: StepPlan, out: StepOutput) -> None:
        """The requests whose forward failed fail; the requests whose prompt the step completed put its KV
        in the shared cache as soon as it exists (concurrent requests with the same prefix, a system
        prompt, reuse it without waiting for this one to finish), and a prefill alone ends; every sampling
        request takes its token."""
        for culprit, reason in out.failed.values():  # only now: freeing a slot moves another request's slot
            self._ends.fail(culprit, reason)
        if len(out.failed) == len(plan.requests):
            self.scheduler.remove_finished()
            return
        self._count_step(plan)
        for req in self.scheduler.prefilled(plan, set(out.failed)):
            self._ends.cache(req, len(req.prompt))
            if not req.generates:
                self._ends.finish(req, "stop")
        self._accept_step(out.sampling, out.tokens)

    def _accept_step(self, sampling: Sequence[Request], tokens: Sequence[int | Exception]) -> None:
        """Each sampling request takes its token (a request that ended since takes none); those that end
        with it finish; the running list drops every finished request."""
        finished: list[tuple[Request, FinishReason]] = []
        for u in self.scheduler.update_from_output(sampling, tokens, time.monotonic()):
            if u.error is not None:
                log.error("request %s failed at its token: %r", u.request.id, u.error, exc_info=u.error)
                self._ends.fail(u.request, u.error)
                continue
            self.counts.tokens_generated += 1
            self._deliveries.delta(u.request, u.delta)
            if u.finish is not None:
                finished.append((u.request, u.finish))
        for req, reason in finished:
            self._ends.finish(req, reason)
        self.scheduler.remove_finished()
