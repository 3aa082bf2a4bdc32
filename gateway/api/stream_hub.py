"""Resumable SSE streams: each stream is produced by its own task into a buffer, and any connection
of its owner reads it from an event id on (`Last-Event-ID`), so a dropped connection loses nothing.

Every event carries `id: <stream id>/<n>`. A stream whose reader drops keeps generating: for the
resume window when it is a plain completion (then it is cancelled, as nobody came back for it), and to
its end when its reply is being stored in a conversation (the reply is saved, as in ChatGPT). A finished
stream stays readable for the window, within a bound on the bytes all finished streams keep.

A stream is bound to the request that started it (its path and canonical JSON body): a resume with
another request is refused (422), never answered with another request's reply.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
from collections import OrderedDict
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from gateway.protocol.errors import ApiError

# Most bytes of finished streams kept for a late resume; the oldest go first past it.
FINISHED_BYTES = 64 * 1024 * 1024


@dataclass(eq=False)
class StreamBuffer:
    id: str
    owner: str
    request: str  # request_fingerprint() of the request that started it
    runs_to_end: bool  # a stored reply: generating to its end even with nobody reading
    events: list[bytes] = field(default_factory=list)
    done: bool = False
    readers: int = 0
    size: int = 0
    producer: asyncio.Task[None] | None = None
    abandon: asyncio.Task[None] | None = None  # while running with nobody reading
    expiry: asyncio.TimerHandle | None = None  # once done: forgotten after the window
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    def append(self, payload: bytes) -> None:
        event = f"id: {self.id}/{len(self.events) + 1}\n".encode() + payload
        self.events.append(event)
        self.size += len(event)
        self._wake()

    def read_now(self) -> bool:
        """Whether a client is reading it at this moment."""
        return self.readers > 0

    def finish(self) -> None:
        self.done = True
        self._wake()

    def _wake(self) -> None:
        self.changed.set()
        self.changed = asyncio.Event()


def request_fingerprint(path: str, payload: Any) -> str:
    """What makes two requests the same one: the path and the JSON body, whatever its key order or spacing."""
    canonical = json.dumps(payload, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(f"{path}\n{canonical}".encode()).hexdigest()


class StreamHub:
    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self._streams: dict[str, StreamBuffer] = {}
        self._finished: OrderedDict[str, StreamBuffer] = OrderedDict()
        self._finished_bytes = 0

    def start(self, stream_id: str, owner: str, source: AsyncIterator[bytes], *, request: str,
              runs_to_end: bool) -> StreamBuffer:
        """Produces `source` (SSE events, each ending in a blank line) into a new buffer, in a task of its own;
        `request` is the fingerprint of the request it answers."""
        buffer = StreamBuffer(stream_id, owner, request, runs_to_end)
        self._streams[stream_id] = buffer
        buffer.producer = asyncio.create_task(self._produce(buffer, source), name=f"sse {stream_id}")
        return buffer

    def get(self, last_event_id: str, owner: str, request: str) -> tuple[StreamBuffer, int]:
        """The stream a `Last-Event-ID` names, and the number of the last event its client received;
        404 for an unknown, expired or another key's stream, as for a wrong id; 422 when `request` (a
        fingerprint) is not the request the stream answers."""
        stream_id, _, number = last_event_id.strip().rpartition("/")
        if not number.isdigit():
            raise ApiError("invalid_value", "Last-Event-ID must be an event id this server sent ('<stream>/<n>').",
                           "Last-Event-ID")
        buffer = self._streams.get(stream_id)
        if buffer is None or buffer.owner != owner:
            raise ApiError("stream_not_found", "No stream to resume with this Last-Event-ID: it ended more than the "
                           "resume window ago, or it belongs to another key.", "Last-Event-ID", status=404)
        if buffer.request != request:
            raise ApiError("last_event_id_reused", "This Last-Event-ID belongs to a stream of a different request: "
                           "resume with the request that started it.", "Last-Event-ID", status=422)
        if int(number) > len(buffer.events):
            raise ApiError("invalid_value", f"Event {number} of this stream was never sent.", "Last-Event-ID")
        return buffer, int(number)

    async def read(self, buffer: StreamBuffer, after: int = 0) -> AsyncIterator[bytes]:
        """The events after number `after`, then the live ones, until the stream's end."""
        buffer.readers += 1
        if buffer.abandon is not None:
            buffer.abandon.cancel()
            buffer.abandon = None
        sent = after
        try:
            while True:
                changed = buffer.changed
                while sent < len(buffer.events):
                    sent += 1
                    yield buffer.events[sent - 1]
                if buffer.done:
                    return
                await changed.wait()
        finally:
            buffer.readers -= 1
            if not buffer.readers and not buffer.done and not buffer.runs_to_end:
                if self.window_s > 0:
                    buffer.abandon = asyncio.create_task(self._abandon(buffer), name=f"sse abandoned {buffer.id}")
                elif buffer.producer is not None:
                    buffer.producer.cancel()  # resume is off: nobody can come back for it

    async def _produce(self, buffer: StreamBuffer, source: AsyncIterator[bytes]) -> None:
        try:
            async for payload in source:
                buffer.append(payload)
        finally:
            buffer.finish()
            close = getattr(source, "aclose", None)
            if close is not None:
                await close()
            self._keep_finished(buffer)

    async def _abandon(self, buffer: StreamBuffer) -> None:
        await asyncio.sleep(self.window_s)
        buffer.abandon = None
        if buffer.producer is not None:
            buffer.producer.cancel()

    def _keep_finished(self, buffer: StreamBuffer) -> None:
        if buffer.abandon is not None:
            buffer.abandon.cancel()
        if self.window_s <= 0:
            self._streams.pop(buffer.id, None)
            return
        self._finished[buffer.id] = buffer
        self._finished_bytes += buffer.size
        while self._finished_bytes > FINISHED_BYTES and self._finished:
            self._forget(next(iter(self._finished)))
        if buffer.id in self._finished:
            buffer.expiry = asyncio.get_running_loop().call_later(self.window_s, self._forget, buffer.id)

    def _forget(self, stream_id: str) -> None:
        buffer = self._finished.pop(stream_id, None)
        if buffer is not None:
            if buffer.expiry is not None:
                buffer.expiry.cancel()
            self._finished_bytes -= buffer.size
            self._streams.pop(stream_id, None)

    async def close(self) -> None:
        """Shutdown: every producer is cancelled and awaited."""
        tasks = [task for buffer in self._streams.values() for task in (buffer.producer, buffer.abandon)
                 if task is not None and not task.done()]
        for buffer in self._streams.values():
            if buffer.expiry is not None:
                buffer.expiry.cancel()
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
