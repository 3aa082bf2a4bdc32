"""A request's end, whatever ends it: its KV left in the prefix cache (unless its conversation ended while it
ran), its KV slot and its penalty row freed, its result or its error delivered, and the engine's counts."""

from __future__ import annotations

import logging
import time

from .backend import FinishReason
from .conversation_ops import ConversationOps
from .counts import EngineCounts
from .delivery import Deliveries
from .device_sampler import DeviceSampler
from .kv_manager import KVManager
from .request import Request, RequestStatus

log = logging.getLogger(__name__)


class Finisher:
    def __init__(self, kv: KVManager, sampler: DeviceSampler | None, conversations: ConversationOps,
                 deliveries: Deliveries, counts: EngineCounts) -> None:
        self._kv = kv
        self._sampler = sampler
        self._conversations = conversations
        self._deliveries = deliveries
        self._counts = counts

    def cache(self, req: Request, upto: int, *, conversation_id: str | None = None) -> None:
        """Its first ``upto`` tokens' KV into the prefix cache (pinned for ``conversation_id``)."""
        if req.kv is not None and upto > 0:
            self._kv.cache_prefix(req.kv, req.tokens, upto, conversation_id=conversation_id)

    def finish(self, req: Request, reason: FinishReason) -> None:
        if req.finished:
            return
        req.status = RequestStatus.FINISHED
        now = time.monotonic()
        counts = self._counts
        if reason == "cancelled":
            counts.requests_cancelled += 1
        counts.requests_finished += 1
        computed = 0 if req.kv is None else self._kv.length(req.kv)
        try:
            if self._conversations.caches(req):
                self.cache(req, computed, conversation_id=req.conversation_id)
        except Exception:  # pragma: no cover - caching is best effort
            log.exception("caching the KV of %s failed", req.id)
        self._release(req)  # the slot is free from here on
        if req.cancel_requested and req.admitted_at and req.cancel_at:
            counts.last_cancel_free_s = max(0.0, time.monotonic() - req.cancel_at)
        counts.avg_request_s = 0.9 * counts.avg_request_s + 0.1 * (now - req.submitted_at)
        if req.generates:
            self._deliveries.result(req, req.result(reason, now))
        elif reason == "cancelled":
            self._deliveries.prefill_cancelled(req)
        else:
            self._deliveries.prefilled(req, max(0, computed - req.cached))

    def fail(self, req: Request, exc: BaseException) -> None:
        if req.finished:
            return
        req.status = RequestStatus.FINISHED
        self._release(req)
        self._counts.requests_failed += 1
        self._deliveries.error(req, exc)

    def _release(self, req: Request) -> None:
        if self._sampler is not None and req.sampler is not None:
            self._sampler.release(req.sampler)
        if req.kv is not None:
            self._kv.free(req.kv)
            req.kv = None
