"""One LLM engine for all sessions: continuous batching, shared prefix KV cache, conversation cache,
early prefill, cancellation and backpressure.

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

from inference.cpu import wait_for_exclusive_work

from .backend import (
    DEFAULT_SAMPLING,
    EngineClosed,
    EngineOverloaded,
    FinishReason,
    GenerationResult,
    GenerationStream,
    SamplingParams,
)
from .cache import PrefixCache, RadixNode
from .constraints import TokenConstraint
from .forward import LeanForward, Segment
from .loader import LoadedLM
from .sampling import IncrementalDetokenizer, RowSampler, StopChecker, sample_rows
from .threads import ThreadPolicy

log = logging.getLogger(__name__)

# The longest the scheduler gives way to exclusive work (inference/cpu.py) before stepping anyway.
EXCLUSIVE_WAIT_MAX_S = 1.0
# A queued request waits for another's prefill of a shared prompt prefix when it would reuse at least
# this many tokens of it (the chat template's default system prompt alone is about 30).
SHARED_PREFIX_MIN_TOKENS = 16


@dataclass(frozen=True)
class EngineConfig:
    max_batch_size: int = 16
    max_queued_requests: int = 64
    prefill_chunk_tokens: int = 256
    prefix_cache_bytes: int = 1 << 30
    # Additions. Intra-op threads of the scheduler thread: 0 = adaptive between 1 and torch's thread
    # count (see threads.py: measured per kind of step, because the CPU is shared); > 0 = fixed.
    threads: int = 0


class _Request:
    __slots__ = (
        "id", "kind", "prompt", "params", "conversation_id", "stream", "future", "loop", "tokens",
        "slot", "cached", "prefilled", "generated", "sampler", "detok", "stopper", "emitted_text",
        "cancelled", "submitted_at", "first_token_at", "max_new", "finished", "admitted_at", "cancel_at",
        "waited_for_prefix", "background",
    )

    def __init__(self, rid: str, kind: str, prompt: list[int], params: SamplingParams | None,
                 conversation_id: str | None, loop: asyncio.AbstractEventLoop) -> None:
        self.id = rid
        self.kind = kind  # "generate" | "prefill"
        self.background = False  # admitted only when no other request waits, one at a time
        self.prompt = prompt
        self.params = params
        self.conversation_id = conversation_id
        self.loop = loop
        self.stream: GenerationStream | None = None
        self.future: asyncio.Future | None = None
        self.tokens: list[int] = list(prompt)  # prompt + generated
        self.slot: int | None = None  # KV pool slot while admitted
        self.cached = 0  # prompt tokens reused from the prefix cache
        self.prefilled = False
        self.generated: list[int] = []
        self.sampler: RowSampler | None = None
        self.detok: IncrementalDetokenizer | None = None
        self.stopper: StopChecker | None = None
        self.emitted_text: list[str] = []
        self.cancelled = False
        self.cancel_at = 0.0
        self.submitted_at = time.monotonic()
        self.admitted_at = 0.0
        self.first_token_at: float | None = None
        self.max_new = 0
        self.finished = False
        self.waited_for_prefix = False  # held in the queue for another request's prefill of a shared prefix



class LLMEngine:
    def __init__(self, lm: LoadedLM, config: EngineConfig = EngineConfig()) -> None:
        if config.max_batch_size < 1 or config.max_queued_requests < 1 or config.prefill_chunk_tokens < 1:
            raise ValueError(f"invalid engine config: {config}")
        self.lm = lm
        self.config = config
        self.fwd = LeanForward.for_model(lm.model, lm.context_window, lm.weight_format, kernel_dir=lm.cache_dir,
                                         kernels=lm.kernels)
        self.pool = self.fwd.new_pool(config.max_batch_size, lm.context_window)
        on_cpu = self.fwd.device.type == "cpu"
        self.threads = ThreadPolicy(torch.get_num_threads(), fixed=config.threads if on_cpu else 1,
                                    probe_weight=self.fwd.layers[0].gu[0] if self.fwd.weight_format == "native"
                                    else None)
        self.cache = PrefixCache(config.prefix_cache_bytes, token_dim=3)
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._queue: deque[_Request] = deque()
        self._active: list[_Request] = []
        self._pins: dict[str, RadixNode] = {}
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
        self._requests_waited_for_prefix = 0
        # Calls to make on event loops, gathered during a step and sent once per loop at its end.
        self._deliveries: dict[asyncio.AbstractEventLoop, list[tuple[_Request, object, tuple]]] | None = None

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
            for r in list(self._queue) + list(self._active):
                r.cancelled = True
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
        with self._lock:
            leftovers = list(self._queue) + list(self._active)
            self._queue.clear()
            self._active.clear()
        for r in leftovers:
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
        if len(prompt) >= self.lm.context_window:
            raise ValueError(
                f"prompt of {len(prompt)} tokens does not fit the context window of {self.lm.context_window} tokens"
            )
        return prompt

    def _enqueue(self, req: _Request) -> None:
        with self._cond:
            if self._closed:
                raise EngineClosed("engine is closed")
            if len(self._queue) >= self.config.max_queued_requests:
                self._requests_rejected += 1
                raise EngineOverloaded(self._retry_after())
            self._queue.append(req)
            self._cond.notify_all()

    def _retry_after(self) -> float:
        per_slot = self._avg_request_s / max(1, self.config.max_batch_size)
        return float(min(30.0, max(0.5, per_slot * (len(self._queue) + 1))))

    def submit(
        self, prompt_ids: Sequence[int], params: SamplingParams = DEFAULT_SAMPLING, *,
        conversation_id: str | None = None, constraint: TokenConstraint | None = None, background: bool = False,
        messages: Sequence[Mapping[str, Any]] | None = None,
    ) -> GenerationStream:
        """Queue a generation; returns at once. Raises EngineOverloaded / EngineClosed / ValueError.
        (``messages`` is for backends that template on their side; this one runs the ids.)

        `constraint`: a fresh grammar state (constraints.py) that decides which tokens it may sample.
        `background`: work nobody waits on (a title): it never delays a live request (see _admit)."""
        loop = asyncio.get_running_loop()
        prompt = self._validate_prompt(prompt_ids)
        if params.max_tokens < 1:
            raise ValueError("max_tokens must be >= 1")
        rid = f"gen-{next(self._ids)}"
        req = _Request(rid, "generate", prompt, params, conversation_id, loop)
        req.background = background
        req.max_new = min(params.max_tokens, self.lm.context_window - len(prompt))
        # Build the sampler now: invalid parameters fail here, on the caller's side.
        req.sampler = RowSampler(
            temperature=params.temperature, top_p=params.top_p, top_k=params.top_k,
            repetition_penalty=params.repetition_penalty, seed=params.seed, prompt_ids=prompt,
            device=self.fwd.device, suppress_ids=tuple(sorted(self._eos)) if params.ignore_eos else (),
            presence_penalty=params.presence_penalty, frequency_penalty=params.frequency_penalty, constraint=constraint,
            probe_ids=params.probe_ids,
        )
        req.detok = IncrementalDetokenizer(self.lm.tokenizer)
        req.stopper = StopChecker(tuple(params.stop))
        stream = GenerationStream(rid, loop, on_cancel=lambda: self._cancel(req))
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
        req = _Request(f"pre-{next(self._ids)}", "prefill", prompt, None, conversation_id, loop)
        req.background = background
        fut = loop.create_future()
        req.future = fut

        def _on_done(f: asyncio.Future) -> None:
            if f.cancelled():
                req.cancelled = True
                self._wake()

        fut.add_done_callback(_on_done)
        self._enqueue(req)
        return fut

    def _cancel(self, req: _Request) -> None:
        """A stream's cancel (any thread): the request stops at the next step boundary."""
        req.cancel_at = time.monotonic()
        req.cancelled = True
        self._wake()

    def describe(self) -> dict[str, Any]:
        return {"backend": "in-process", **self.fwd.describe()}

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
        s = dict(self.cache.snapshot())
        s.update(self.threads.snapshot())
        steps = self._steps
        s.update(
            queue_depth=len(self._queue),
            active=len(self._active),
            conversations_pinned=len(self._pins),
            steps=steps,
            tokens_generated=self._tokens_generated,
            prefill_tokens=self._prefill_tokens,
            requests_finished=self._requests_finished,
            requests_cancelled=self._requests_cancelled,
            requests_failed=self._requests_failed,
            requests_rejected=self._requests_rejected,
            step_seconds_total=self._step_seconds,
            kv_pool_capacity_tokens=self.pool.capacity,
            kv_pool_slots_used=self.pool.used,
            avg_step_ms=(self._step_seconds / steps * 1000.0) if steps else 0.0,
            avg_batch_size=(self._step_rows / steps) if steps else 0.0,  # requests per step
            last_cancel_free_ms=self._last_free_latency * 1000.0,
            exclusive_wait_seconds_total=self._exclusive_wait_seconds,
            requests_waited_for_shared_prefix=self._requests_waited_for_prefix,
        )
        return s

    # -- scheduler thread ----------------------------------------------------------------------------------
    def _run(self) -> None:
        torch.set_grad_enabled(False)
        if self.fwd.device.type != "cpu":
            self.threads = ThreadPolicy(1, fixed=max(1, self.config.threads or torch.get_num_threads()))
        while True:
            with self._cond:
                while self._running and not self._queue and not self._active and not self._conv_ops:
                    self._cond.wait()
                if not self._running:
                    break
            try:
                self._apply_conv_ops()
                self._drop_cancelled()
                self._admit()
                if self._active:
                    self._yield_to_exclusive_work()
                    self._deliveries = {}
                    try:
                        self._step()
                    finally:
                        self._flush_deliveries()
            except Exception as exc:  # a bug, not a bad request: fail what is running, keep serving
                log.exception("LLM engine step failed")
                with self._lock:
                    broken = list(self._active)
                    self._active = []
                for r in broken:
                    self._fail(r, exc)
        self._finish_leftovers()
        log.debug("LLM engine thread stopped")

    def _yield_to_exclusive_work(self) -> None:
        """Let work that needs every core (a reply's first clause in Piper) have them; see inference/cpu.py."""
        if self.fwd.device.type == "cpu":
            self._exclusive_wait_seconds += wait_for_exclusive_work(EXCLUSIVE_WAIT_MAX_S)

    def _apply_conv_ops(self) -> None:
        while True:
            with self._lock:
                if not self._conv_ops:
                    return
                op, conv = self._conv_ops.popleft()
            if op == "end":
                self.cache.release(self._pins.pop(conv, None))
                with self._lock:
                    in_flight = any(r.conversation_id == conv for r in (*self._queue, *self._active))
                if in_flight:
                    self._ended_in_flight.add(conv)
            elif op == "clear":
                for node in self._pins.values():
                    self.cache.unpin(node)
                self._pins.clear()
                self.cache.clear()

    def _drop_cancelled(self) -> None:
        with self._lock:
            queued = [r for r in self._queue if r.cancelled]
            for r in queued:
                self._queue.remove(r)
            active = [r for r in self._active if r.cancelled]
            if active:
                self._active = [r for r in self._active if not r.cancelled]
        for r in queued + active:
            self._finish(r, "cancelled")

    def _admit(self) -> None:
        while True:
            with self._lock:
                if len(self._active) >= self.config.max_batch_size:
                    return
                queued = list(self._queue)
            # The oldest request that need not wait; the waiting ones keep their place (and count
            # against the queue's limit). Judged outside the lock, which submit() takes on the event
            # loop; only this thread removes requests from the queue.
            req = next((r for r in queued if not r.background and not self._should_wait_for_shared_prefix(r)), None)
            if req is None and not any(not r.background for r in queued):
                # Background work (titles, pre-warms) only when no live request waits, one at a time:
                # it may share a step with live replies but never takes a slot one of them wants.
                with self._lock:
                    busy = any(r.background for r in self._active)
                req = None if busy else next((r for r in queued if not self._should_wait_for_shared_prefix(r)), None)
            if req is None:
                return
            with self._lock:
                self._queue.remove(req)
            self._admit_one(req)

    def _should_wait_for_shared_prefix(self, req: _Request) -> bool:
        """Whether ``req`` shares a prompt prefix with a request that is still prefilling it, long enough
        to be worth waiting for: that request's KV goes into the prefix cache when its prompt is done
        (one step for a short prompt), and ``req`` then prefills only the rest. Requests that arrive
        together with the same system prompt thus compute it once, not once each."""
        if self.cache.max_bytes <= 0:
            return False
        limit = len(req.prompt) - 1 if req.kind == "generate" else len(req.prompt)
        cached = -1
        for other in self._active:
            if other.prefilled or other.slot is None:
                continue
            shared = _shared_length(req.prompt, other.prompt, limit)
            if shared < SHARED_PREFIX_MIN_TOKENS:
                continue
            if cached < 0:
                cached = self.cache.match(req.prompt, max_length=limit, record=False).length
            gain = shared - cached
            still_to_compute = len(other.prompt) - self.pool.lengths[other.slot]
            # Waiting costs at most the other's remaining prefill; worth it when it saves at least half.
            if gain >= SHARED_PREFIX_MIN_TOKENS and 2 * gain >= still_to_compute:
                if not req.waited_for_prefix:
                    req.waited_for_prefix = True
                    self._requests_waited_for_prefix += 1
                return True
        return False

    def _admit_one(self, req: _Request) -> None:
        try:
            self._start_request(req)
        except Exception as exc:
            log.exception("admission of %s failed", req.id)
            self._fail(req, exc)
            return
        if req.kind == "prefill" and self._computed(req) == len(req.prompt):
            req.prefilled = True  # everything was cached already
            self._finish(req, "stop")
            return
        with self._lock:
            self._active.append(req)

    def _computed(self, req: _Request) -> int:
        return 0 if req.slot is None else self.pool.lengths[req.slot]

    def _start_request(self, req: _Request) -> None:
        req.admitted_at = time.monotonic()
        n = len(req.prompt)
        # A generation must compute at least its last prompt token (its logits give the first token).
        limit = n - 1 if req.kind == "generate" else n
        match = self.cache.match(req.prompt, max_length=limit)
        slot = self.pool.acquire(req)
        try:
            pos = 0
            for piece in self.cache.gather(match):
                self.pool.write(slot, pos, piece)
                pos += piece.shape[3]
        except BaseException:
            self.pool.release(req.slot)
            req.slot = None
            raise
        req.cached = match.length

    def _step(self) -> None:
        t0 = time.perf_counter()
        pool = self.pool
        budget = self.config.prefill_chunk_tokens
        # (request, start, n, tokens): one token per decoding request, prompt chunks within the budget.
        parts: list[tuple[_Request, int, int, list[int]]] = []
        for req in self._active:
            p = pool.lengths[req.slot]
            if req.prefilled:
                parts.append((req, p, 1, [req.tokens[p]]))
            elif budget > 0:
                n = min(len(req.prompt) - p, budget)
                budget -= n
                parts.append((req, p, n, req.prompt[p : p + n]))
        if not parts:
            return
        # Single-token segments first, by slot (they share one batched attention call), then chunks.
        singles = sorted((x for x in parts if x[2] == 1), key=lambda x: x[0].slot)
        chunks = [x for x in parts if x[2] > 1]
        segs: list[Segment] = []
        rows: list[_Request] = []
        feed: list[int] = []
        positions: list[int] = []
        logit_rows: list[int] = []
        sample_reqs: list[_Request] = []
        done_prefill: list[_Request] = []
        r0 = 0
        for req, p, n, toks in singles + chunks:
            segs.append(Segment(req.slot, p, n))
            rows.append(req)
            feed.extend(toks)
            positions.extend(range(p, p + n))
            if req.prefilled:
                logit_rows.append(r0)
                sample_reqs.append(req)
            elif p + n == len(req.prompt):
                done_prefill.append(req)
                if req.kind == "generate":
                    logit_rows.append(r0 + n - 1)
                    sample_reqs.append(req)
            r0 += n
        out = self._forward(segs, rows, feed, positions, logit_rows)
        if out is None:  # every request in the step failed
            return
        logits, failed = out
        self._steps += 1
        self._step_rows += len(rows)
        if self.step_observer is not None:
            self.step_observer(len(rows))
        self._prefill_tokens += sum(s.n for s, r in zip(segs, rows) if not r.prefilled)
        for req in done_prefill:
            if id(req) in failed:
                continue
            req.prefilled = True
            # The prompt's KV goes to the shared cache as soon as it exists: concurrent requests with
            # the same prefix (system prompt) reuse it without waiting for this one to finish.
            self._cache_insert(req, len(req.prompt), pin=False)
            if req.kind == "prefill":
                self._finish(req, "stop")
        now = time.monotonic()
        finished: list[tuple[_Request, FinishReason]] = []
        if failed:
            sample_reqs = [r for r in sample_reqs if id(r) not in failed]
        if sample_reqs:
            for req, tok in zip(sample_reqs, sample_rows(logits, [r.sampler for r in sample_reqs])):
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
        with self._lock:
            self._active = [r for r in self._active if not r.finished]
        self._step_seconds += time.perf_counter() - t0

    def _forward(self, segs, rows, feed, positions, logit_rows):
        """Run the step: (logits of the sampling rows, ids of failed requests), or None.

        If the batched pass fails, each request runs alone to find the culprit (nothing is committed
        before a pass completes, so re-running a segment is safe); the culprits fail, the others go on.
        """
        dev = self.fwd.device
        pool = self.pool
        rows_n = len(feed)
        self.threads.before_step(rows_n)
        t0 = time.perf_counter()
        try:
            pool.ensure_capacity(max(s.start + s.n for s in segs))
            logits = self.fwd.forward(
                pool,
                torch.tensor(feed, dtype=torch.long, device=dev),
                torch.tensor(positions, dtype=torch.long, device=dev),
                segs, logit_rows,
            )
            if logits.device.type != "cpu":
                torch.cuda.synchronize(logits.device)
            self.threads.after_step(rows_n, time.perf_counter() - t0)
            return logits, set()
        except Exception as exc:
            if len(segs) == 1:
                log.exception("forward failed for %s", rows[0].id)
                self._fail(rows[0], exc)
                return None
            log.exception("batched forward failed; retrying requests one by one")
        failed: dict[int, tuple[_Request, BaseException]] = {}
        pieces = []
        r0 = 0
        for seg, req in zip(segs, rows):
            local = [lr - r0 for lr in logit_rows if r0 <= lr < r0 + seg.n]
            try:
                out = self.fwd.forward(
                    pool,
                    torch.tensor(feed[r0 : r0 + seg.n], dtype=torch.long, device=dev),
                    torch.tensor(positions[r0 : r0 + seg.n], dtype=torch.long, device=dev),
                    [seg], local,
                )
                if local:
                    pieces.append(out)
            except Exception as exc:
                failed[id(req)] = (req, exc)
            r0 += seg.n
        for req, exc in failed.values():  # only now: releasing a slot moves another request's slot
            self._fail(req, exc)
        logits = torch.cat(pieces) if pieces else torch.empty((0, self._vocab), device=dev)
        return logits, set(failed)

    def _accept_token(self, req: _Request, tok: int, now: float) -> FinishReason | None:
        if req.first_token_at is None:
            req.first_token_at = now
        req.generated.append(tok)
        req.tokens.append(tok)
        req.sampler.observe(tok)
        self._tokens_generated += 1
        if tok in self._eos and not req.params.ignore_eos:
            self._emit(req, req.stopper.feed(req.detok.flush())[0] + req.stopper.flush())
            return "stop"
        out, stopped = req.stopper.feed(req.detok.push(tok))
        if stopped:
            self._emit(req, out)
            return "stop"
        if len(req.generated) >= req.max_new:
            tail, stopped = req.stopper.feed(req.detok.flush())
            self._emit(req, out + tail + ("" if stopped else req.stopper.flush()))
            return "stop" if stopped else "length"
        self._emit(req, out)
        return None

    def _emit(self, req: _Request, delta: str) -> None:
        if not delta:
            return
        req.emitted_text.append(delta)
        self._call(req, req.stream.deliver, delta, None, None)

    def _call(self, req: _Request, fn, *args) -> None:
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
    def _send(loop: asyncio.AbstractEventLoop, calls: list[tuple[_Request, object, tuple]]) -> None:
        try:
            loop.call_soon_threadsafe(_run_calls, calls)
        except RuntimeError:  # the event loop is closed: nobody listens any more
            for req, _, _ in calls:
                req.cancelled = True

    def _cache_insert(self, req: _Request, upto: int, *, pin: bool) -> RadixNode | None:
        if req.slot is None or upto <= 0:
            return None
        upto = min(upto, self.pool.lengths[req.slot])
        pool, slot = self.pool, req.slot
        return self.cache.insert(req.tokens[:upto], lambda a, b: pool.view(slot, a, b), pin=pin)

    def _release(self, req: _Request) -> None:
        if req.slot is not None:
            self.pool.release(req.slot)
            req.slot = None

    def _finish(self, req: _Request, reason: FinishReason) -> None:
        if req.finished:
            return
        req.finished = True
        now = time.monotonic()
        if reason == "cancelled":
            self._requests_cancelled += 1
        self._requests_finished += 1
        computed = self._computed(req)
        conv = req.conversation_id
        ended = conv is not None and conv in self._ended_in_flight
        if ended:
            with self._lock:
                others = any(r is not req and r.conversation_id == conv for r in (*self._queue, *self._active))
            if not others:
                self._ended_in_flight.discard(conv)  # its last request: nothing more to keep unpinned
        try:
            if computed > 0 and not ended:
                node = self._cache_insert(req, computed, pin=conv is not None)
                if conv is not None:
                    old = self._pins.pop(req.conversation_id, None)
                    if node is not None:
                        self._pins[req.conversation_id] = node
                    self.cache.unpin(old)
        except Exception:  # pragma: no cover - caching is best effort
            log.exception("caching the KV of %s failed", req.id)
        self._release(req)  # the slot is free from here on
        if req.cancelled and req.admitted_at and req.cancel_at:
            self._last_free_latency = max(0.0, time.monotonic() - req.cancel_at)
        dur = now - req.submitted_at
        self._avg_request_s = 0.9 * self._avg_request_s + 0.1 * dur
        if req.kind == "prefill":
            fut = req.future
            if reason == "cancelled":
                self._call(req, _cancel_future, fut)
            else:
                self._call(req, _resolve_future, fut, max(0, computed - req.cached))
            return
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

    def _fail(self, req: _Request, exc: BaseException) -> None:
        if req.finished:
            return
        req.finished = True
        self._release(req)
        self._requests_failed += 1
        if req.kind == "prefill":
            self._call(req, _fail_future, req.future, exc)
        else:
            self._call(req, req.stream.deliver, None, None, exc)


def _shared_length(a: Sequence[int], b: Sequence[int], limit: int) -> int:
    """Length of the common prefix of ``a`` and ``b``, at most ``limit``: compared a block at a time."""
    n = min(len(a), len(b), limit)
    i = 0
    while i < n:
        j = min(n, i + 64)
        if a[i:j] != b[i:j]:
            while a[i] == b[i]:
                i += 1
            return i
        i = j
    return n


def _run_calls(calls: list[tuple[_Request, object, tuple]]) -> None:
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
