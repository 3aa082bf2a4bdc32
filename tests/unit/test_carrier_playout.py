"""A carrier's playout: marks every 100 ms of a reply and where it stops; what was heard is what the carrier
echoed; a clear drops the pending marks (the carrier echoes them at once, and they say nothing was heard)."""

from __future__ import annotations

import numpy as np

from media.carrier_playout import MARK_EVERY_MS, CarrierPlayout, HeardLedger

RATE, FRAME = 8000, 160


def playout(cleared: list[bool] | None = None) -> CarrierPlayout:
    return CarrierPlayout(RATE, FRAME, on_clear=lambda: cleared.append(True) if cleared is not None else None)


def send_all(buffer: CarrierPlayout) -> list[tuple[str, float, bool]]:
    """Read every frame as the pacer does, with the marks it makes due: (name, sent_ms, last)."""
    marks, last_item = [], None
    while True:
        frame = buffer.read_frame()
        last_item = frame.item_id or last_item
        mark = buffer.mark_due(frame, last_item)
        if mark is not None:
            marks.append((mark.name, mark.sent_ms, mark.last))
        if frame.stopped or not frame.audio_samples:
            return marks


def test_a_reply_is_marked_every_100_ms_and_where_it_stops() -> None:
    buffer = playout()
    buffer.write("item_a", np.ones(int(RATE * 0.35), np.int16))  # 350 ms
    marks = send_all(buffer)
    assert [(sent, last) for _, sent, last in marks] == [(100.0, False), (200.0, False), (300.0, False), (350.0, True)]
    assert MARK_EVERY_MS == 100.0


def test_heard_is_what_the_carrier_echoed_not_what_was_sent() -> None:
    buffer = playout()
    buffer.write("item_a", np.ones(int(RATE * 0.35), np.int16))
    marks = send_all(buffer)
    assert buffer.sent_ms("item_a") == 350.0 and buffer.played_ms("item_a") == 0.0
    assert buffer.echoed(marks[1][0]) is not None  # the carrier played up to the second mark (the first with it)
    assert buffer.played_ms("item_a") == 200.0
    last = buffer.echoed(marks[-1][0])
    assert last is not None and last.last and last.item_id == "item_a"
    assert buffer.played_ms("item_a") == 350.0
    assert buffer.echoed(marks[0][0]) is None  # already passed: not pending any more


def test_a_clear_tells_the_transport_and_its_pending_marks_say_nothing() -> None:
    cleared: list[bool] = []
    buffer = playout(cleared)
    buffer.write("item_a", np.ones(int(RATE * 0.35), np.int16))
    marks = send_all(buffer)
    buffer.echoed(marks[0][0])
    buffer.clear()
    assert cleared == [True]
    for name, _, _ in marks[1:]:  # Twilio echoes what a clear dropped
        assert buffer.echoed(name) is None
    assert buffer.played_ms("item_a") == 100.0


def test_the_ledger_keeps_each_reply_apart_and_ignores_names_not_its_own() -> None:
    ledger = HeardLedger()
    first, second = ledger.sent("item_a", 100.0, last=True), ledger.sent("item_b", 100.0, last=False)
    assert first.name != second.name
    assert ledger.echoed("somebody else's") is None
    assert ledger.echoed(second.name) == second  # the first was played before it
    assert (ledger.heard_ms("item_a"), ledger.heard_ms("item_b"), ledger.heard_ms("item_c")) == (100.0, 100.0, 0.0)
