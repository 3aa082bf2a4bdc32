"""Outbound audio for a carrier's media stream (Twilio Media Streams and the like), where the carrier plays it.

The gateway sends the audio paced at 20 ms a frame, as a WebRTC track does, but what the caller has heard is
only known from the carrier: after each stretch of a reply's audio the gateway sends a named mark, and the
carrier echoes the mark once the audio before it has played. `CarrierPlayout.played_ms` is what the echoes
confirm, so a reply cut by an interruption keeps only what the caller heard. On `clear` the carrier drops the
audio it holds and echoes the marks still pending at once: those say nothing was heard, and are ignored.

Pure core (no asyncio): the transport calls `mark_due` after each frame it sends, `echoed` for each mark the
carrier sends back, and is told of every clear through `on_clear`.
"""

from __future__ import annotations

import itertools
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from media.playout import PlayoutBuffer, PlayoutFrame

# A mark every this much of a reply's audio: the grain of what an interruption keeps of it.
MARK_EVERY_MS = 100.0


@dataclass(frozen=True)
class SentMark:
    name: str
    item_id: str
    sent_ms: float  # the item's audio sent before the mark
    last: bool  # the end of a stretch of audio: its echo says the reply played out


class HeardLedger:
    """The marks sent and not yet echoed, and what each reply's echoes confirm was heard."""

    def __init__(self) -> None:
        self._pending: deque[SentMark] = deque()
        self._heard: dict[str, float] = {}
        self._names = itertools.count(1)

    def sent(self, item_id: str, sent_ms: float, *, last: bool) -> SentMark:
        mark = SentMark(f"m{next(self._names)}", item_id, sent_ms, last)
        self._pending.append(mark)
        return mark

    def echoed(self, name: str) -> SentMark | None:
        """The carrier played up to mark `name` (the marks before it too: it plays in order). None when the name
        is not pending: dropped by a clear, or not ours."""
        if not any(mark.name == name for mark in self._pending):
            return None
        while True:
            mark = self._pending.popleft()
            self._heard[mark.item_id] = max(self._heard.get(mark.item_id, 0.0), mark.sent_ms)
            if mark.name == name:
                return mark

    def cleared(self) -> None:
        """The carrier drops what it holds: the marks pending were not reached."""
        self._pending.clear()

    def heard_ms(self, item_id: str) -> float:
        return self._heard.get(item_id, 0.0)


class CarrierPlayout(PlayoutBuffer):
    """A PlayoutBuffer whose `played_ms` is what the carrier confirmed, and whose `clear` tells the transport."""

    def __init__(self, sample_rate: int, frame_samples: int, on_clear: Callable[[], None]) -> None:
        super().__init__(sample_rate, frame_samples)
        self._ledger = HeardLedger()
        self._ledger_lock = threading.Lock()
        self._on_clear = on_clear
        self._marked: dict[str, float] = {}  # each item's audio sent up to its last mark

    def clear(self) -> int:
        dropped = super().clear()
        with self._ledger_lock:
            self._ledger.cleared()
        self._on_clear()
        return dropped

    def played_ms(self, item_id: str) -> float:
        """What the caller heard of this item: the audio before the last of its marks the carrier echoed."""
        with self._ledger_lock:
            return self._ledger.heard_ms(item_id)

    def sent_ms(self, item_id: str) -> float:
        """The item's audio handed to the transport so far."""
        return super().played_ms(item_id)

    def mark_due(self, frame: PlayoutFrame, item_id: str | None) -> SentMark | None:
        """The mark to send after `frame` (`item_id`: the reply it carried, or the one that just stopped), if one is
        due: one per MARK_EVERY_MS of a reply's audio, and one where its audio stops."""
        if item_id is None:
            return None
        sent = self.sent_ms(item_id)
        if not frame.stopped and sent - self._marked.get(item_id, 0.0) < MARK_EVERY_MS:
            return None
        self._marked[item_id] = sent
        with self._ledger_lock:
            return self._ledger.sent(item_id, sent, last=frame.stopped)

    def echoed(self, name: str) -> SentMark | None:
        with self._ledger_lock:
            return self._ledger.echoed(name)
