"""Which requests run, and what the next step computes (vLLM v1's ``core/sched`` seam).

The scheduler owns the waiting queue and the running list. Each step it admits waiting requests
into free KV slots (the KV manager loads their longest cached prefix) and returns a :class:`StepPlan`:
the rows of the step, their positions and slots, the prompt chunks, and which rows sample. It runs
nothing: the model runner executes the plan and samples its rows, and the scheduler takes the tokens
back (``update_from_output``).

A queued request whose prompt shares at least ``SHARED_PREFIX_MIN_TOKENS`` tokens with a request still
prefilling them waits, keeping its place, when that saves at least half of the other's remaining
prefill: requests that arrive together with one system prompt compute it once.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from .backend import FinishReason
from .kv_manager import KVManager
from .request import Request, RequestStatus
from .step_plan import Segment, StepPlan

# A queued request waits for another's prefill of a shared prompt prefix when it would reuse at least
# this many tokens of it (the chat template's default system prompt alone is about 30).
SHARED_PREFIX_MIN_TOKENS = 16


@dataclass
class Admitted:
    """A request taken from the queue: running, already complete (a prefill whose KV was all
    cached), or failed with ``error``."""

    request: Request
    complete: bool = False
    error: Exception | None = None


@dataclass(slots=True)
class TokenUpdate:
    """A sampling request after a step: the text its token gives and why it ends, or the error that fails it."""

    request: Request
    delta: str = ""
    finish: FinishReason | None = None
    error: Exception | None = None


class Scheduler:
    def __init__(self, kv: KVManager, *, max_batch_size: int, prefill_chunk_tokens: int,
                 lock: threading.Lock) -> None:
        self.kv = kv
        self.max_batch_size = max_batch_size
        self.prefill_chunk_tokens = prefill_chunk_tokens
        self._lock = lock  # the engine's: submit() appends to ``waiting`` on the event loop
        self._waiting: deque[Request] = deque()
        self._running: list[Request] = []
        self.requests_waited_for_prefix = 0
        self.rows_paced = 0  # decode rows left out of a step for requests needed sooner (see schedule)

    # -- queue: the scheduler's own; ``add`` and ``requests`` under the caller's hold of the lock ----------
    def add(self, req: Request) -> None:
        """Queue a request (the engine's submit, on the event loop, holding the lock)."""
        self._waiting.append(req)

    def requests(self) -> tuple[Request, ...]:
        """Every request queued or running (the caller holds the lock, or is the scheduler thread)."""
        return (*self._waiting, *self._running)

    @property
    def queued(self) -> int:
        return len(self._waiting)

    @property
    def active(self) -> int:
        return len(self._running)

    def take_running(self) -> list[Request]:
        """Take every running request out (a step that failed: the engine fails them)."""
        with self._lock:
            taken, self._running = self._running, []
        return taken

    def drop_cancelled(self) -> list[Request]:
        """Take every request whose cancel was asked out of the queue and the running list."""
        with self._lock:
            queued = [r for r in self._waiting if r.cancel_requested]
            for r in queued:
                self._waiting.remove(r)
            running = [r for r in self._running if r.cancel_requested]
            if running:
                self._running = [r for r in self._running if not r.cancel_requested]
        return queued + running

    def remove_finished(self) -> None:
        with self._lock:
            self._running = [r for r in self._running if not r.finished]

    def take_all(self) -> list[Request]:
        with self._lock:
            out = list(self._waiting) + list(self._running)
            self._waiting.clear()
            self._running = []
        return out

    # -- after a step (vLLM v1's update_from_output) ------------------------------------------------------
    def prefilled(self, plan: StepPlan, failed: set[int]) -> list[Request]:
        """The requests whose prompt's KV the step completed (less those of ``failed``, by id): they decode now."""
        done = [r for r in plan.prefill_done if id(r) not in failed]
        for req in done:
            req.status = RequestStatus.DECODING
        return done

    def update_from_output(self, sampling: Sequence[Request], tokens: Sequence[int | Exception],
                           now: float) -> list[TokenUpdate]:
        """Each sampling request takes its token (``tokens[i]`` is ``sampling[i]``'s, or the error its row
        raised); a request that finished in the meantime takes none."""
        updates = []
        for req, tok in zip(sampling, tokens):
            if isinstance(tok, Exception):
                updates.append(TokenUpdate(req, error=tok))
            elif not req.finished:
                try:
                    delta, reason = req.accept(tok, now)
                except Exception as exc:
                    updates.append(TokenUpdate(req, error=exc))
                else:
                    updates.append(TokenUpdate(req, delta, reason))
        return updates

    # -- admission -------------------------------------------------------------------------------------
    def admit(self) -> list[Admitted]:
        admitted: list[Admitted] = []
        while True:
            with self._lock:
                if len(self._running) >= self.max_batch_size:
                    return admitted
                # A cancelled request's reader has its result at the cancel (GenerationStream.so_far), so
                # its next turn may already wait: that one comes in once the engine has cached this one's KV.
                if any(r.cancel_requested for r in self._running):
                    return admitted
                queued = list(self._waiting)
            # The oldest request that need not wait; the waiting ones keep their place. Judged outside
            # the lock, which submit() takes on the event loop; only this thread removes from the queue.
            req = next((r for r in queued if not r.background and not self._should_wait_for_shared_prefix(r)), None)
            if req is None and not any(not r.background for r in queued):
                # Background work (titles, pre-warms) only when no live request waits, one at a time:
                # it may share a step with live replies but never takes a slot one of them wants.
                busy = any(r.background for r in self._running)
                req = None if busy else next((r for r in queued if not self._should_wait_for_shared_prefix(r)), None)
            if req is None:
                return admitted
            admitted.append(self._start(req))

    def _start(self, req: Request) -> Admitted:
        """Load its cached prefix, then move it from the queue to the running set in one go: the queue
        depth and the running count never both miss it (a reader that waits for the engine to be idle
        saw 0 and 0 while the prefix loaded)."""
        req.admitted_at = time.monotonic()
        try:
            match = self.kv.match(req.prompt, max_length=req.prefix_limit)
            handle = self.kv.allocate()
            try:
                self.kv.load_prefix(handle, match)
            except BaseException:
                self.kv.free(handle)
                raise
        except Exception as exc:
            self._dequeue(req)
            return Admitted(req, error=exc)
        req.kv = handle
        req.cached = match.length
        req.status = RequestStatus.PREFILLING
        if not req.generates and match.length == len(req.prompt):
            self._dequeue(req)
            return Admitted(req, complete=True)  # every token was cached already
        with self._lock:
            self._waiting.remove(req)
            self._running.append(req)
        return Admitted(req)

    def _dequeue(self, req: Request) -> None:
        with self._lock:
            self._waiting.remove(req)

    def _should_wait_for_shared_prefix(self, req: Request) -> bool:
        if not self.kv.caches_prefixes:
            return False
        limit = req.prefix_limit
        cached = -1
        for other in self._running:
            if other.status is not RequestStatus.PREFILLING or other.kv is None:
                continue
            shared = _shared_length(req.prompt, other.prompt, limit)
            if shared < SHARED_PREFIX_MIN_TOKENS:
                continue
            if cached < 0:
                cached = self.kv.match(req.prompt, max_length=limit, record=False).length
            gain = shared - cached
            still_to_compute = len(other.prompt) - self.kv.length(other.kv)
            # Waiting costs at most the other's remaining prefill; worth it when it saves at least half.
            if gain >= SHARED_PREFIX_MIN_TOKENS and 2 * gain >= still_to_compute:
                if not req.waited_for_prefix:
                    req.waited_for_prefix = True
                    self.requests_waited_for_prefix += 1
                return True
        return False

    def paced_until(self, now: float) -> float | None:
        """When the first running request is needed, if each one is a decode whose reader needs no token yet
        (GenerationStream.pace); None when any must run now."""
        if not self._running or any(r.status is not RequestStatus.DECODING or r.not_needed_before <= now
                                   for r in self._running):
            return None
        return min(r.not_needed_before for r in self._running)

    # -- the step --------------------------------------------------------------------------------------
    def schedule(self, now: float | None = None) -> StepPlan | None:
        """The next step: one token per decoding request, prompt chunks within the chunk budget.

        A decoding request whose reader needs no token before a later time (``not_needed_before``: a spoken
        reply whose audio plays on for a while) sits out the steps that other requests need now, a new
        reply's prompt or first words above all: a step of fewer rows is shorter, and the cores it leaves go
        to the speech of those replies. It runs in every other step, so the engine never idles for it."""
        now = time.monotonic() if now is None else now
        budget = self.prefill_chunk_tokens
        parts: list[tuple[Request, int, int, list[int]]] = []
        for req in self._running:
            assert req.kv is not None
            p = self.kv.length(req.kv)
            if req.status is RequestStatus.DECODING:
                parts.append((req, p, 1, [req.tokens[p]]))
            elif budget > 0:
                n = min(len(req.prompt) - p, budget)
                budget -= n
                parts.append((req, p, n, req.prompt[p : p + n]))
        if not parts:
            return None
        needed = [x for x in parts if x[0].status is not RequestStatus.DECODING or x[0].not_needed_before <= now]
        if needed and len(needed) < len(parts):
            self.rows_paced += len(parts) - len(needed)
            parts = needed
        # Single-token segments first, by slot (they share one batched attention call), then chunks.
        singles = sorted((x for x in parts if x[2] == 1), key=lambda x: _slot(x[0]))
        chunks = [x for x in parts if x[2] > 1]
        plan = StepPlan(ahead=not needed)
        r0 = 0
        for req, p, n, toks in singles + chunks:
            plan.segments.append(Segment(_slot(req), p, n))
            plan.requests.append(req)
            plan.token_ids.extend(toks)
            plan.positions.extend(range(p, p + n))
            if req.status is RequestStatus.DECODING:
                plan.logit_rows.append(r0)
                plan.sampling.append(req)
            elif p + n == len(req.prompt):
                plan.prefill_done.append(req)
                if req.generates:
                    plan.logit_rows.append(r0 + n - 1)
                    plan.sampling.append(req)
            r0 += n
        return plan


def _slot(req: Request) -> int:
    assert req.kv is not None
    return req.kv.slot


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
