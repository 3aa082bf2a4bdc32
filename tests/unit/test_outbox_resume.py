"""The outbox's replay buffer and readers: what a resumed connection gets is exactly the events after
the client's last sequence number, then the live stream, and a superseded reader gets nothing more."""

from __future__ import annotations

import asyncio
import json

import pytest

from gateway.realtime.outbox import Outbox, OutboxReader, ReplayUnavailable


def _send(outbox: Outbox, count: int) -> None:
    for _ in range(count):
        outbox.send({"type": "response.output_text.delta", "delta": "x" * 50})


async def _take(reader: OutboxReader, count: int) -> list[int]:
    return [json.loads(await asyncio.wait_for(reader.next(), 1))["sequence_number"] for _ in range(count)]


async def test_a_resume_replays_exactly_the_events_after_the_last_sequence_then_the_live_ones() -> None:
    outbox = Outbox(replay_bytes=1 << 20)
    first = outbox.attach()
    _send(outbox, 10)
    assert await _take(first, 6) == [1, 2, 3, 4, 5, 6]  # the client received 1..3; 4..6 were lost in flight
    second = outbox.attach(after=3)
    _send(outbox, 2)
    assert await _take(second, 9) == list(range(4, 13))
    assert first.superseded and await first.next() is None


async def test_a_reader_waiting_for_events_ends_when_another_takes_over() -> None:
    outbox = Outbox(replay_bytes=1 << 20)
    first = outbox.attach()
    waiting = asyncio.create_task(first.next())
    await asyncio.sleep(0)
    second = outbox.attach()
    assert await asyncio.wait_for(waiting, 1) is None
    _send(outbox, 1)
    assert await _take(second, 1) == [1]


async def test_events_sent_while_no_reader_is_attached_wait_for_the_next_one() -> None:
    outbox = Outbox(replay_bytes=1 << 20)
    first = outbox.attach()
    _send(outbox, 2)
    assert await _take(first, 2) == [1, 2]
    _send(outbox, 3)  # the connection is gone: nobody reads
    assert await _take(outbox.attach(after=2), 3) == [3, 4, 5]


async def test_events_older_than_the_buffer_cannot_be_replayed() -> None:
    outbox = Outbox(replay_bytes=500)  # about five of these events
    reader = outbox.attach()
    _send(outbox, 20)
    await _take(reader, 20)
    with pytest.raises(ReplayUnavailable, match="no longer kept"):
        outbox.attach(after=2)
    assert await _take(outbox.attach(after=17), 3) == [18, 19, 20]


async def test_a_sequence_never_sent_is_refused() -> None:
    outbox = Outbox(replay_bytes=1 << 20)
    reader = outbox.attach()
    _send(outbox, 5)
    await _take(reader, 2)
    for after in (4, 9, -1):  # 3..5 are queued but were never handed to a connection
        with pytest.raises(ReplayUnavailable, match="never sent"):
            outbox.attach(after=after)
    assert await _take(outbox.attach(after=2), 3) == [3, 4, 5]


async def test_without_a_replay_buffer_only_the_unsent_events_remain() -> None:
    outbox = Outbox()
    reader = outbox.attach()
    _send(outbox, 3)
    await _take(reader, 2)
    with pytest.raises(ReplayUnavailable):
        outbox.attach(after=1)
    assert await _take(outbox.attach(after=2), 1) == [3]


async def test_replayed_events_count_as_unread_for_the_slow_consumer_bound() -> None:
    probe = Outbox()
    _send(probe, 1)
    size = len(await probe.attach().next())  # type: ignore[arg-type]
    outbox = Outbox(max_pending_bytes=10 * size + size // 2, replay_bytes=1 << 20)
    reader = outbox.attach()
    _send(outbox, 8)
    await _take(reader, 8)
    outbox.attach(after=0)  # the eight events are unread again
    _send(outbox, 2)
    with pytest.raises(Exception, match="bytes of events unread"):
        _send(outbox, 1)
    assert outbox.overflowed and outbox.closed


async def test_a_closed_outbox_ends_its_reader_after_the_queued_events() -> None:
    outbox = Outbox(replay_bytes=1 << 20)
    reader = outbox.attach()
    _send(outbox, 2)
    outbox.close()
    assert await _take(reader, 2) == [1, 2]
    assert await reader.next() is None and not reader.superseded


async def test_a_tap_sees_every_event_from_when_it_tapped_in_without_taking_the_readers() -> None:
    outbox = Outbox(replay_bytes=1 << 20)
    reader = outbox.attach()
    _send(outbox, 2)
    tap = outbox.tap()
    _send(outbox, 3)
    assert [json.loads(await tap.next())["sequence_number"] for _ in range(3)] == [3, 4, 5]
    assert await _take(reader, 5) == [1, 2, 3, 4, 5]  # the attached transport still gets them all
    outbox.close()
    assert await asyncio.wait_for(tap.next(), 1) is None


async def test_a_tap_that_falls_behind_is_cut_off_and_the_session_goes_on() -> None:
    outbox = Outbox()
    reader = outbox.attach()
    tap = outbox.tap(max_pending_bytes=300)
    _send(outbox, 10)  # about 1 KB: past the tap's bound, well within the outbox's
    assert tap.overflowed and not outbox.closed
    received = []
    while (wire := await asyncio.wait_for(tap.next(), 1)) is not None:
        received.append(json.loads(wire)["sequence_number"])
    assert received == list(range(1, len(received) + 1)) and len(received) < 10
    assert await _take(reader, 10) == list(range(1, 11))


async def test_what_only_a_sideband_hears_never_reaches_the_reader_nor_takes_a_sequence_number() -> None:
    outbox = Outbox()
    reader = outbox.attach()
    outbox.reflect({"type": "session.input_audio.append", "audio": ""})  # nobody watches: dropped
    tap = outbox.tap()
    assert outbox.tapped
    outbox.reflect({"type": "session.input_audio.append", "audio": "AAAA"})
    outbox.send({"type": "session.output_audio.delta", "delta": "AAAA"}, identified=False, tapped=False)
    _send(outbox, 1)
    assert json.loads(await tap.next()) == {"type": "session.input_audio.append", "audio": "AAAA"}
    assert json.loads(await tap.next())["sequence_number"] == 2  # the primary's audio went to the reader alone
    assert json.loads(await reader.next())["type"] == "session.output_audio.delta"
    assert await _take(reader, 1) == [2]
