"""A conversation's end and the cache's clearing, asked from any thread and carried out on the scheduler
thread between steps (the KV manager's pins and cache are that thread's).

A conversation ended while a request of it is still queued or running leaves that request's KV out of
the cache when it finishes: a pin would never be released, and nobody will ask for that KV again.
"""

from __future__ import annotations

import threading
from collections import deque
from typing import Literal

from .kv_manager import KVManager
from .request import Request
from .scheduler import Scheduler


class ConversationOps:
    def __init__(self, kv: KVManager, scheduler: Scheduler, lock: threading.Lock) -> None:
        self._kv = kv
        self._scheduler = scheduler
        self._lock = lock  # the engine's, which guards the scheduler's queue
        self._pending: deque[tuple[Literal["end", "clear"], str]] = deque()  # appended under the lock
        self._ended_in_flight: set[str] = set()

    def ask(self, op: Literal["end", "clear"], conversation_id: str = "") -> None:
        """Queue an operation (the caller holds the lock and wakes the scheduler thread)."""
        self._pending.append((op, conversation_id))

    @property
    def pending(self) -> bool:
        return bool(self._pending)

    def apply(self) -> None:
        """Carry out what was asked (the scheduler thread, or anyone while it does not run)."""
        while True:
            with self._lock:
                if not self._pending:
                    return
                op, conv = self._pending.popleft()
            if op == "end":
                self._kv.end_conversation(conv)
                with self._lock:
                    in_flight = any(r.conversation_id == conv for r in self._scheduler.requests())
                if in_flight:
                    self._ended_in_flight.add(conv)
            else:
                self._kv.clear()

    def caches(self, req: Request) -> bool:
        """Whether ``req``, which finishes, leaves its KV in the cache (not when its conversation ended
        while it ran); its conversation's last such request forgets the end."""
        conv = req.conversation_id
        if conv is None or conv not in self._ended_in_flight:
            return True
        with self._lock:
            others = any(r is not req and r.conversation_id == conv for r in self._scheduler.requests())
        if not others:
            self._ended_in_flight.discard(conv)
        return False
