"""Server events leaving a session: ids, sequence numbers, and a bounded queue to the transport writer.

`send()` is synchronous on purpose: a state change and the events that announce it happen in one
step of the event loop, so no other handler can observe (or interleave with) half of it.
"""

from __future__ import annotations

import asyncio
import itertools
import secrets
from collections import deque
from typing import Any

from gateway.protocol.codec import encode_server_event


class SlowConsumer(Exception):
    """The client stopped reading; the session is closed rather than buffering without limit."""


class Outbox:
    def __init__(self, max_pending_bytes: int = 64 * 1024 * 1024) -> None:
        self._queue: deque[str] = deque()
        self._pending_bytes = 0
        self._max_pending_bytes = max_pending_bytes
        self._ready = asyncio.Event()
        self._closed = False
        self.overflowed = False  # closed because the client stopped reading
        self._sequence = itertools.count(1)
        self._prefix = secrets.token_hex(4)

    def send(self, event: dict[str, Any]) -> None:
        if self._closed:
            return
        sequence = next(self._sequence)
        event = {"event_id": f"event_{self._prefix}{sequence}", **event, "sequence_number": sequence}
        wire = encode_server_event(event)
        self._queue.append(wire)
        self._pending_bytes += len(wire)
        self._ready.set()
        if self._pending_bytes > self._max_pending_bytes:
            self.overflowed = True
            self.close()
            raise SlowConsumer(f"more than {self._max_pending_bytes} bytes of events unread")

    async def next(self) -> str | None:
        """The next encoded event; None once closed and drained."""
        while not self._queue:
            if self._closed:
                return None
            self._ready.clear()
            await self._ready.wait()
        wire = self._queue.popleft()
        self._pending_bytes -= len(wire)
        return wire

    def close(self) -> None:
        self._closed = True
        self._ready.set()
