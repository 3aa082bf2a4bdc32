"""Server events leaving a session: ids, sequence numbers, a bounded queue to the transport writer,
and the bounded replay buffer that lets a client resume after a dropped connection.

`send()` is synchronous on purpose: a state change and the events that announce it happen in one
step of the event loop, so no other handler can observe (or interleave with) half of it.

One reader (the transport that is attached) takes events in order. A transport that attaches with
the last sequence number its client received gets the events after it again, from the replay buffer,
then the live stream: no duplicates and no gaps. A new reader supersedes the old one, whose `next()`
then returns None, so two connections never split one session's events between them.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import secrets
from collections import deque
from typing import Any

from gateway.protocol.codec import encode_server_event


class SlowConsumer(Exception):
    """The client stopped reading; the session is closed rather than buffering without limit."""


class ReplayUnavailable(ValueError):
    """A resume asked for events the session no longer keeps, or never sent."""


class Outbox:
    def __init__(self, max_pending_bytes: int = 64 * 1024 * 1024, replay_bytes: int = 0, *, numbered: bool = True) -> None:
        self._queue: deque[tuple[int, str]] = deque()  # not yet handed to a reader
        self._sent: deque[tuple[int, str]] = deque()  # handed out, kept for a resume (replay_bytes at most)
        self._pending_bytes = 0
        self._sent_bytes = 0
        self._max_pending_bytes = max_pending_bytes
        self._replay_bytes = replay_bytes
        self._ready = asyncio.Event()
        self._reader_generation = 0
        self._closed = False
        self.overflowed = False  # closed because the client stopped reading
        self._sequence = itertools.count(1)
        self._last_sequence = 0
        self._prefix = secrets.token_hex(4)
        self._taps: list[OutboxTap] = []  # sideband connections: every event from when they tapped in
        self._numbered = numbered  # Realtime's events carry their sequence number; GPT-Live's have none

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def tapped(self) -> bool:
        """Whether a sideband watches: what only it is sent (reflect) is worth making."""
        return bool(self._taps)

    def send(self, event: dict[str, Any], *, identified: bool = True, tapped: bool = True) -> None:
        """Queue one event, with its id (GPT-Live's audio deltas have none: `identified` False); `tapped` False
        keeps it from the sideband (GPT-Live's primary audio: a sideband is sent its own copy, reflect)."""
        if self._closed:
            return
        sequence = next(self._sequence)
        self._last_sequence = sequence
        if identified:
            event = {"event_id": f"event_{self._prefix}{sequence}", **event}
        if self._numbered:
            event["sequence_number"] = sequence
        wire = encode_server_event(event)
        if tapped:
            for tap in list(self._taps):
                tap.put(wire)
        self._queue.append((sequence, wire))
        self._pending_bytes += len(wire)
        self._ready.set()
        if self._pending_bytes > self._max_pending_bytes:
            self.overflowed = True
            self.close()
            raise SlowConsumer(f"more than {self._max_pending_bytes} bytes of events unread")

    def reflect(self, event: dict[str, Any]) -> None:
        """An event for the sideband alone (GPT-Live reflects the session's audio to it), with no id or sequence
        number: the attached transport's stream, and its resume, never see it."""
        if self._closed or not self._taps:
            return
        wire = encode_server_event(event)
        for tap in list(self._taps):
            tap.put(wire)

    def attach(self, after: int | None = None) -> OutboxReader:
        """A reader for the transport now attached, superseding any other. With `after` (the last
        sequence number the client received), the events after it are sent again first; without it,
        the reader goes on with the events no reader has taken yet."""
        if after is not None:
            self._rewind(after)
        self._reader_generation += 1
        self._ready.set()  # wakes the superseded reader, which then ends
        self._ready = asyncio.Event()
        if self._queue or self._closed:
            self._ready.set()
        return OutboxReader(self, self._reader_generation)

    def _rewind(self, after: int) -> None:
        cursor = self._queue[0][0] if self._queue else self._last_sequence + 1  # the next event to hand out
        oldest_kept = self._sent[0][0] if self._sent else cursor
        if not 0 <= after < cursor:
            raise ReplayUnavailable(
                f"last_sequence {after} was never sent by this session (its last sent event is {cursor - 1}).")
        if after + 1 < oldest_kept:
            raise ReplayUnavailable(
                f"The events after {after} are no longer kept (the oldest kept is {oldest_kept}); start a new session.")
        while self._sent and self._sent[-1][0] > after:
            entry = self._sent.pop()
            self._sent_bytes -= len(entry[1])
            self._pending_bytes += len(entry[1])
            self._queue.appendleft(entry)

    async def _next(self, generation: int) -> str | None:
        while True:
            if generation != self._reader_generation:
                return None
            if self._queue:
                break
            if self._closed:
                return None
            ready = self._ready  # attach() replaces it: a superseded reader wakes on the one it waits on
            ready.clear()
            await ready.wait()
        entry = self._queue.popleft()
        self._pending_bytes -= len(entry[1])
        if self._replay_bytes:
            self._sent.append(entry)
            self._sent_bytes += len(entry[1])
            while self._sent_bytes > self._replay_bytes:
                self._sent_bytes -= len(self._sent.popleft()[1])
        return entry[1]

    def tap(self, max_pending_bytes: int = 16 * 1024 * 1024) -> OutboxTap:
        """A second stream of the events sent from now on, for an observer beside the attached transport (a
        sideband connection to a WebRTC call): it never takes events from the reader, and one that falls
        `max_pending_bytes` behind is cut off rather than holding the session's memory."""
        tap = OutboxTap(self, max_pending_bytes)
        if self._closed:
            tap.put(None)
        else:
            self._taps.append(tap)
        return tap

    def untap(self, tap: OutboxTap) -> None:
        with contextlib.suppress(ValueError):
            self._taps.remove(tap)

    def close(self) -> None:
        self._closed = True
        self._ready.set()
        for tap in self._taps:
            tap.put(None)
        self._taps.clear()


class OutboxTap:
    def __init__(self, outbox: Outbox, max_pending_bytes: int) -> None:
        self._outbox = outbox
        self._queue: asyncio.Queue[str | None] = asyncio.Queue()
        self._pending_bytes = 0
        self._max_pending_bytes = max_pending_bytes
        self.overflowed = False

    def put(self, wire: str | None) -> None:
        if wire is not None:
            self._pending_bytes += len(wire)
            if self._pending_bytes > self._max_pending_bytes:
                self.overflowed = True
                self._outbox.untap(self)
                wire = None
        self._queue.put_nowait(wire)

    async def next(self) -> str | None:
        """The next event; None once the session is over (or this tap fell too far behind)."""
        wire = await self._queue.get()
        if wire is not None:
            self._pending_bytes -= len(wire)
        return wire


class OutboxReader:
    """One attached transport's view of the outbox."""

    def __init__(self, outbox: Outbox, generation: int) -> None:
        self._outbox = outbox
        self._generation = generation

    @property
    def superseded(self) -> bool:
        return self._generation != self._outbox._reader_generation

    async def next(self) -> str | None:
        """The next encoded event; None once the outbox is closed and drained, or another reader took over."""
        return await self._outbox._next(self._generation)
