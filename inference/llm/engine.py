"""One LLM engine for all sessions: continuous batching, shared prefix KV cache, conversation cache,
early prefill, cancellation and backpressure.

Its parts, along vLLM v1's seams: the :class:`~.scheduler.Scheduler` admits requests and returns a step
plan; the :class:`~.kv_manager.KVManager` hands out KV slots and holds the prefix cache; the
:class:`~.model_runner.ModelRunner` executes a plan (CUDA graphs on a GPU); this module owns the
scheduler thread, turns logits into tokens and delivers them.

Threads: the event loop calls :meth:`LLMEngine.submit` / :meth:`LLMEngine.prefill` (non-blocking: they
only enqueue); one scheduler thread owns the model, the KV buffers and the prefix cache. Every step it

1. drops cancelled requests and admits queued ones up to ``max_batch_size`` (prefix-cache lookup:
   the longest cached prefix of the prompt is copied into the request's own KV buffer). A request
   whose prompt shares a long prefix with one still being prefilled waits in the queue until that KV
   is in the cache, so requests arriving together with one system prompt compute it once;
2. builds one ragged batch: one token per decoding request plus prompt chunks of prefilling requests
   (at most ``prefill_chunk_tokens`` prompt tokens per step, so a long prompt never stalls the others);
3. runs one forward pass (:mod:`.forward`), samples one token for every row that needs it
   (:mod:`.sampling`), and hands text deltas to the event loop with ``call_soon_threadsafe``.

A request that finishes (any reason) leaves the KV of its prompt + generated tokens in the prefix cache.
With a ``conversation_id`` that KV is also pinned for the conversation until its next request or
:meth:`LLMEngine.end_conversation`, which drops what only that conversation used (shared prefixes stay). Reuse is always by token content (longest common prefix), so a
truncated conversation reuses exactly the KV of the kept tokens and recomputes the rest.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from inference.cpu import charge, wait_for_exclusive_work, wait_for_idle_cores

from .backend import (
    DEFAULT_SAMPLING,
    EngineClosed,
    EngineOverloaded,
    FinishReason,
    GenerationResult,
    GenerationStream,
    SamplingParams,
)
from .constraints import TokenConstraint
from .forward import LeanForward
from .kv_manager import KVManager
from .loader import LoadedLM
from .model_runner import ModelRunner
from .output import TextOutput
from .request import Request, RequestStatus
from .sampling import DevicePenalties, RowSampler, sample_rows
from .scheduler import Scheduler, StepPlan
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


class LLMEngine:
    def __init__(self, lm: LoadedLM, config: EngineConfig = EngineConfig()) -> None:
        if config.max_batch_size < 1 or config.max_queued_requests < 1 or config.prefill_chunk_tokens < 1:
            raise ValueError(f"invalid engine config: {config}")
        self.lm = lm
        self.config = config
        self.fwd = LeanForward.for_model(lm.model, lm.context_window, lm.weight_format, kernel_dir=lm.cache_dir,
                                         kernels=lm.kernels)
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
        # The static path's greedy rows keep their penalties' ids on the device (sampling.py).
        self._masks = DevicePenalties(config.max_batch_size, self.fwd.device) if static else None
        self.threads = ThreadPolicy(torch.get_num_threads(), fixed=config.threads if on_cpu else 1,
                                    probe_weight=self.fwd.layers[0].gu[0] if self.fwd.weight_format == "native"
                                    else None)
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self.scheduler = Scheduler(self.kv, max_batch_size=config.max_batch_size,
                                   prefill_chunk_tokens=config.prefill_chunk_tokens, lock=self._lock)
        # Conversations ended while a request of theirs was still queued or running: that request's
        # KV is not cached when it finishes (a pin would never be released, and nobody will reuse it).
        self._ended_in_flight: set[str] = set()
        self._conv_ops: deque[tuple[str, str]] = deque()  # (op, conversation_id) done on the scheduler thread
        self._thread: threading.Thread | None = None
        self._running = False
        self._closed = False
        self._ids = itertools.count(1)
        self._eos = lm.eos_token_ids
        self._vocab = self.fwd.vocab_size
        # Counters (written by the scheduler thread, read anywhere).
        self._steps = 0
        self._step_rows = 0  # requests in the steps, summed: / steps is the average batch
        # Called with each step's batch size on the scheduler thread (the gateway's histogram); must not block.
        self.step_observer: Callable[[int], None] | None = None
        self._tokens_generated = 0
        self._prefill_tokens = 0
        self._requests_finished = 0
        self._requests_cancelled = 0
        self._requests_failed = 0
        self._requests_rejected = 0
        self._step_seconds = 0.0
        self._avg_request_s = 2.0
        self._last_free_latency = 0.0
        self._exclusive_wait_seconds = 0.0
        self._paced_wait_seconds = 0.0
        # Calls to make on event loops, gathered during a step and sent once per loop at its end.
        self._deliveries: dict[asyncio.AbstractEventLoop, list[tuple[Request, object, tuple]]] | None = None

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
            self._finish(r, "cancelled")

    def __enter__(self) -> LLMEngine:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _wake(self) -> None:
        with self._cond:
            self._cond.notify_all()

    # -- submission (event loop thread) ----------------------------------------------------------------
    def _validate_prompt(self, prompt_ids: Sequence[int]) -> list[int]:
        prompt = [int(t) for t in prompt_ids]
        if not prompt:
            raise ValueError("empty prompt")
        bad = [t for t in prompt if t < 0 or t >= self._vocab]
        if bad:
            raise ValueError(f"token ids out of the vocabulary (0..{self._vocab - 1}): {bad[:5]}")
        if len(prompt) >= self.context_window:
            raise ValueError(
                f"prompt of {len(prompt)} tokens does not fit the context window of {self.context_window} tokens"
            )
        return prompt

    def _enqueue(self, req: Request) -> None:
        with self._cond:
            if self._closed:
                raise EngineClosed("engine is closed")
            if self.scheduler.queued >= self.config.max_queued_requests:
                self._requests_rejected += 1
                raise EngineOverloaded(self._retry_after())
            self.scheduler.add(req)
            self._cond.notify_all()

    def awaiting_first_token(self) -> bool:
        """Whether a live request that samples still waits for its first token (queued, or in its prefill)."""
        with self._lock:
            requests = self.scheduler.requests()
        return any(r.generates and not r.background and r.first_token_at is None for r in requests)

    def _retry_after(self) -> float:
        per_slot = self._avg_request_s / max(1, self.config.max_batch_size)
        return float(min(30.0, max(0.5, per_slot * (self.scheduler.queued + 1))))

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
        prompt = self._validate_prompt(prompt_ids)
        if params.max_tokens < 1:
            raise ValueError("max_tokens must be >= 1")
        rid = f"gen-{next(self._ids)}"
        req = Request(rid, prompt, params, conversation_id, loop, background=background)
        req.max_new = min(params.max_tokens, self.context_window - len(prompt))
        # Build the sampler now: invalid parameters fail here, on the caller's side.
        req.sampler = RowSampler(
            temperature=params.temperature, top_p=params.top_p, top_k=params.top_k,
            repetition_penalty=params.repetition_penalty, seed=params.seed, prompt_ids=prompt,
            device=self.fwd.device, suppress_ids=tuple(sorted(self._eos)) if params.ignore_eos else (),
            presence_penalty=params.presence_penalty, frequency_penalty=params.frequency_penalty, constraint=constraint,
            probe_ids=params.probe_ids,
        )
        req.output = TextOutput(self.lm.tokenizer, stop=params.stop, max_new=req.max_new,
                                eos_ids=frozenset() if params.ignore_eos else self._eos)
        stream = GenerationStream(rid, loop, on_cancel=lambda: self._cancel(req),
                                  on_pace=lambda until: setattr(req, "not_needed_before", until))
        req.stream = stream
        self._enqueue(req)
        return stream

    def prefill(
        self, prompt_ids: Sequence[int], *, conversation_id: str, background: bool = False,
        messages: Sequence[Mapping[str, Any]] | None = None,
    ) -> asyncio.Future[int]:
        """Compute (and pin for the conversation) the KV of ``prompt_ids`` ahead of the request.

        Resolves to the number of tokens whose KV this call computed (0 when all were cached).
        Cancelling the returned future cancels the prefill. `background`: as in submit (a pre-warm).
        """
        loop = asyncio.get_running_loop()
        prompt = self._validate_prompt(prompt_ids)
        req = Request(f"pre-{next(self._ids)}", prompt, None, conversation_id, loop, background=background)
        fut: asyncio.Future[int] = loop.create_future()
        req.future = fut

        def _on_done(f: asyncio.Future) -> None:
            if f.cancelled():
                req.cancel_requested = True
                self._wake()

        fut.add_done_callback(_on_done)
        self._enqueue(req)
        return fut

    def _cancel(self, req: Request) -> None:
        """A stream's cancel (any thread): the request stops at the next step boundary."""
        req.cancel_at = time.monotonic()
        req.cancel_requested = True
        self._wake()

    def describe(self) -> dict[str, Any]:
        return {"backend": "in-process", **self.fwd.describe(), **self.runner.describe()}

    def end_conversation(self, conversation_id: str) -> None:
        """The conversation is over (its session closed): unpin its KV and drop the part no other
        sequence shares, which nobody will ask for again (it had filled the cache's budget with dead
        conversations and evicted shared prefixes instead). A request of it still running caches
        nothing when it stops."""
        with self._cond:
            self._conv_ops.append(("end", conversation_id))
            self._cond.notify_all()
        if self._thread is None:
            self._apply_conv_ops()

    def clear_prefix_cache(self) -> None:
        """Drop every cached prefix (pins included) at the next step boundary."""
        with self._cond:
            self._conv_ops.append(("clear", ""))
            self._cond.notify_all()
        if self._thread is None:
            self._apply_conv_ops()

    def stats(self) -> dict[str, float]:
        s = self.kv.stats()
        s.update(self.threads.snapshot())
        s.update(self.runner.stats())
        steps = self._steps
        s.update(
            queue_depth=self.scheduler.queued,
            active=self.scheduler.active,
            steps=steps,
            tokens_generated=self._tokens_generated,
            prefill_tokens=self._prefill_tokens,
            requests_finished=self._requests_finished,
            requests_cancelled=self._requests_cancelled,
            requests_failed=self._requests_failed,
            requests_rejected=self._requests_rejected,
            step_seconds_total=self._step_seconds,
            avg_step_ms=(self._step_seconds / steps * 1000.0) if steps else 0.0,
            avg_batch_size=(self._step_rows / steps) if steps else 0.0,  # requests per step
            last_cancel_free_ms=self._last_free_latency * 1000.0,
            exclusive_wait_seconds_total=self._exclusive_wait_seconds,
            requests_waited_for_shared_prefix=self.scheduler.requests_waited_for_prefix,
            decode_rows_paced=self.scheduler.rows_paced,
            paced_wait_seconds_total=self._paced_wait_seconds,
        )
        return s

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
                       and not self._conv_ops):
                    self._cond.wait()
                if not self._running:
                    break
            try:
                self._apply_conv_ops()
                for r in self.scheduler.drop_cancelled():
                    self._finish(r, "cancelled")
                self._admit()
                if self.scheduler.active:
                    self._yield_to_exclusive_work()
                    if self._yield_while_paced():
                        continue
                    self._deliveries = {}
                    try:
                        self._step()
                    finally:
                        self._flush_deliveries()
            except Exception as exc:  # a bug, not a bad request: fail what is running, keep serving
                log.exception("LLM engine step failed")
                for r in self.scheduler.take_running():
                    self._fail(r, exc)
        self._finish_leftovers()
        log.debug("LLM engine thread stopped")

    def _yield_to_exclusive_work(self) -> None:
        """Let work that needs every core (a reply's first clause in Piper) have them; see inference/cpu.py."""
        if self.fwd.device.type == "cpu":
            self._exclusive_wait_seconds += wait_for_exclusive_work(EXCLUSIVE_WAIT_MAX_S)

    def _yield_while_paced(self) -> bool:
        """While every reply is ahead of its listener and Whisper or Piper runs, let them have the cores: wait a
        little (new work and cancels are looked at again after it), until they end or a reply is due."""
        if self.fwd.device.type != "cpu":
            return False
        now = time.monotonic()
        due = self.scheduler.paced_until(now)
        if due is None:
            return False
        waited = wait_for_idle_cores(min(due - now, PACED_POLL_S))
        self._paced_wait_seconds += waited
        return waited > 0.0

    def _apply_conv_ops(self) -> None:
        while True:
            with self._lock:
                if not self._conv_ops:
                    return
                op, conv = self._conv_ops.popleft()
            if op == "end":
                self.kv.end_conversation(conv)
                with self._lock:
                    in_flight = any(r.conversation_id == conv for r in self.scheduler.requests())
                if in_flight:
                    self._ended_in_flight.add(conv)
            elif op == "clear":
                self.kv.clear()

    def _admit(self) -> None:
        for admitted in self.scheduler.admit():
            req = admitted.request
            if admitted.error is not None:
                log.error("admission of %s failed: %r", req.id, admitted.error)
                self._fail(req, admitted.error)
            elif admitted.complete:
                self._finish(req, "stop")

    def _step(self) -> None:
        t0 = time.perf_counter()
        plan = self.scheduler.schedule()
        if plan is None:
            return
        out = self._forward(plan)
        if out is None:  # every request in the step failed
            self.scheduler.remove_finished()
            return
        logits, failed = out
        self._steps += 1
        self._step_rows += len(plan.requests)
        if self.step_observer is not None:
            self.step_observer(len(plan.requests))
        self._prefill_tokens += plan.prefill_tokens
        for req in plan.prefill_done:
            if id(req) in failed:
                continue
            req.status = RequestStatus.DECODING
            # The prompt's KV goes to the shared cache as soon as it exists: concurrent requests with
            # the same prefix (system prompt) reuse it without waiting for this one to finish.
            self._cache_insert(req, len(req.prompt))
            if not req.generates:
                self._finish(req, "stop")
        now = time.monotonic()
        finished: list[tuple[Request, FinishReason]] = []
        sample_reqs = plan.sampling
        if failed:  # the logits are the other requests' already
            sample_reqs = [r for r in sample_reqs if id(r) not in failed]
        if sample_reqs:
            samplers = [r.sampler for r in sample_reqs]
            for req, tok in zip(sample_reqs, sample_rows(logits, samplers, self._masks)):  # type: ignore[arg-type]
                if isinstance(tok, Exception):
                    log.error("sampling for %s failed: %r", req.id, tok)
                    self._fail(req, tok)
                    continue
                if req.finished:
                    continue
                try:
                    reason = self._accept_token(req, tok, now)
                except Exception as exc:
                    log.exception("request %s failed after sampling", req.id)
                    self._fail(req, exc)
                    continue
                if reason is not None:
                    finished.append((req, reason))
        for req, reason in finished:
            self._finish(req, reason)
        self.scheduler.remove_finished()
        self._step_seconds += time.perf_counter() - t0

    def _forward(self, plan: StepPlan) -> tuple[torch.Tensor, set[int]] | None:
        """Run the step: (logits of the sampling rows, ids of failed requests), or None.

        If the batched pass fails, each request runs alone to find the culprit (nothing is committed
        before a pass completes, so re-running a segment is safe); the culprits fail, the others go on.
        """
        rows_n = plan.rows
        threads = self.threads.before_step(rows_n)
        t0 = time.perf_counter()
        try:
            # No synchronization with a GPU here: the step's one wait is the copy of the sampled ids back
            # (sampling.py), which comes after the work queued behind the forward.
            logits = self.runner.execute(plan)
            seconds = time.perf_counter() - t0
            self.threads.after_step(rows_n, seconds)
            if logits.device.type == "cpu":
                charge("llm", threads * seconds)
            return logits, set()
        except Exception as exc:
            if len(plan.segments) == 1:
                log.exception("forward failed for %s", plan.requests[0].id)
                self._fail(plan.requests[0], exc)
                return None
            log.exception("batched forward failed; retrying requests one by one")
        failed: dict[int, tuple[Request, BaseException]] = {}
        pieces = []
        r0 = 0
        for seg, req in zip(plan.segments, plan.requests):
            alone = StepPlan(requests=[req], segments=[seg], token_ids=plan.token_ids[r0 : r0 + seg.n],
                             positions=plan.positions[r0 : r0 + seg.n],
                             logit_rows=[lr - r0 for lr in plan.logit_rows if r0 <= lr < r0 + seg.n])
            try:
                out = self.runner.execute(alone)
                if alone.logit_rows:
                    pieces.append(out)
            except Exception as error:
                failed[id(req)] = (req, error)
            r0 += seg.n
        for culprit, reason in failed.values():  # only now: freeing a slot moves another request's slot
            self._fail(culprit, reason)
        logits = torch.cat(pieces) if pieces else torch.empty((0, self._vocab), device=self.fwd.device)
        return logits, set(failed)

    def _accept_token(self, req: Request, tok: int, now: float) -> FinishReason | None:
        assert req.sampler is not None and req.output is not None
        if req.first_token_at is None:
            req.first_token_at = now
        req.generated.append(tok)
        req.tokens.append(tok)
        req.sampler.observe(tok)
        self._tokens_generated += 1
        delta, reason = req.output.accept(tok, len(req.generated))
        self._emit(req, delta)
        return reason

    def _emit(self, req: Request, delta: str) -> None:
        if not delta:
            return
        req.emitted_text.append(delta)
        assert req.stream is not None
        self._call(req, req.stream.deliver, delta, None, None)

    def _call(self, req: Request, fn, *args) -> None:
        if self._deliveries is not None:  # in a step: sent with the step's other calls
            self._deliveries.setdefault(req.loop, []).append((req, fn, args))
        else:
            self._send(req.loop, [(req, fn, args)])

    def _flush_deliveries(self) -> None:
        """One wake-up of each event loop per step, not one per token: with 8 streams, 8 cross-thread
        calls a step took 0.3 ms of the scheduler's time, and as many GIL hand-overs."""
        batch, self._deliveries = self._deliveries or {}, None
        for loop, calls in batch.items():
            self._send(loop, calls)

    @staticmethod
    def _send(loop: asyncio.AbstractEventLoop, calls: list[tuple[Request, object, tuple]]) -> None:
        try:
            loop.call_soon_threadsafe(_run_calls, calls)
        except RuntimeError:  # the event loop is closed: nobody listens any more
            for req, _, _ in calls:
                req.cancel_requested = True

    def _cache_insert(self, req: Request, upto: int, *, conversation_id: str | None = None) -> None:
        if req.kv is not None and upto > 0:
            self.kv.cache_prefix(req.kv, req.tokens, upto, conversation_id=conversation_id)

    def _release(self, req: Request) -> None:
        if self._masks is not None and req.sampler is not None:
            self._masks.release(req.sampler)
        if req.kv is not None:
            self.kv.free(req.kv)
            req.kv = None

    def _finish(self, req: Request, reason: FinishReason) -> None:
        if req.finished:
            return
        req.status = RequestStatus.FINISHED
        now = time.monotonic()
        if reason == "cancelled":
            self._requests_cancelled += 1
        self._requests_finished += 1
        computed = 0 if req.kv is None else self.kv.length(req.kv)
        conv = req.conversation_id
        ended = conv is not None and conv in self._ended_in_flight
        if ended:
            with self._lock:
                others = any(r is not req and r.conversation_id == conv for r in self.scheduler.requests())
            if not others:
                self._ended_in_flight.discard(conv)  # its last request: nothing more to keep unpinned
        try:
            if computed > 0 and not ended:
                self._cache_insert(req, computed, conversation_id=conv)
        except Exception:  # pragma: no cover - caching is best effort
            log.exception("caching the KV of %s failed", req.id)
        self._release(req)  # the slot is free from here on
        if req.cancel_requested and req.admitted_at and req.cancel_at:
            self._last_free_latency = max(0.0, time.monotonic() - req.cancel_at)
        dur = now - req.submitted_at
        self._avg_request_s = 0.9 * self._avg_request_s + 0.1 * dur
        if not req.generates:
            fut = req.future
            if reason == "cancelled":
                self._call(req, _cancel_future, fut)
            else:
                self._call(req, _resolve_future, fut, max(0, computed - req.cached))
            return
        assert req.stream is not None
        result = GenerationResult(
            text="".join(req.emitted_text),
            token_ids=list(req.generated),
            finish_reason=reason,
            prompt_tokens=len(req.prompt),
            completion_tokens=len(req.generated),
            cached_prompt_tokens=req.cached,
            submitted_at=req.submitted_at,
            first_token_at=req.first_token_at,
            finished_at=now,
            first_step_probability=req.sampler.probed if req.sampler is not None else None,
            admitted_at=req.admitted_at or None,
        )
        self._call(req, req.stream.deliver, None, result, None)

    def _fail(self, req: Request, exc: BaseException) -> None:
        if req.finished:
            return
        req.status = RequestStatus.FINISHED
        self._release(req)
        self._requests_failed += 1
        if not req.generates:
            self._call(req, _fail_future, req.future, exc)
        else:
            assert req.stream is not None
            self._call(req, req.stream.deliver, None, None, exc)


def _run_calls(calls: list[tuple[Request, object, tuple]]) -> None:
    """On the event loop: one step's calls, in order (a stream's deltas before its result)."""
    for req, fn, args in calls:
        try:
            fn(*args)  # type: ignore[operator]
        except Exception:  # one stream's consumer must not cost the others their tokens
            log.exception("delivering to request %s failed", req.id)


def _resolve_future(fut: asyncio.Future, value) -> None:
    if not fut.done():
        fut.set_result(value)


def _cancel_future(fut: asyncio.Future) -> None:
    if not fut.done():
        fut.cancel()


def _fail_future(fut: asyncio.Future, exc: BaseException) -> None:
    if not fut.done():
        fut.set_exception(exc)
