"""The hub's state machine for sessions whose transport dropped: parked until resumed or the window
passes, taken over only by the key that opened them, never ended by a transport that was superseded."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import pytest

from gateway.protocol.errors import ApiError
from gateway.realtime.outbox import Outbox
from gateway.realtime.session_hub import SessionHub


@dataclass(eq=False)
class SessionStub:
    resume_token: str
    id: str = "sess_stub"
    outbox: Outbox = field(default_factory=Outbox)


def _hub(window_s: float) -> tuple[SessionHub, list[SessionStub]]:
    ended: list[SessionStub] = []

    async def end_session(session: SessionStub) -> None:  # type: ignore[misc]
        hub.remove(session)  # type: ignore[arg-type]
        ended.append(session)

    hub = SessionHub(window_s, end_session)  # type: ignore[arg-type]
    return hub, ended


async def test_a_parked_session_ends_when_its_window_passes() -> None:
    hub, ended = _hub(0.05)
    session = SessionStub("t1")
    attachment = hub.add(session, "key")  # type: ignore[arg-type]
    assert hub.park(session, attachment) and hub.parked == 1  # type: ignore[arg-type]
    await asyncio.sleep(0.15)
    assert ended == [session] and hub.parked == 0
    with pytest.raises(ApiError, match="No session to resume"):
        hub.take("t1", "key")


async def test_taking_a_parked_session_stops_its_timer() -> None:
    hub, ended = _hub(0.05)
    session = SessionStub("t1")
    hub.park(session, hub.add(session, "key"))  # type: ignore[arg-type]
    taken, attachment = hub.take("t1", "key")
    await asyncio.sleep(0.15)
    assert taken is session and not ended and not attachment.superseded.is_set()


async def test_another_key_gets_the_same_404_as_a_wrong_token() -> None:
    hub, _ = _hub(60)
    hub.add(SessionStub("t1"), "owner")  # type: ignore[arg-type]
    for token, key in (("t1", "intruder"), ("nope", "owner")):
        with pytest.raises(ApiError) as refused:
            hub.take(token, key)
        assert (refused.value.code, refused.value.status) == ("session_not_found", 404)


async def test_a_superseded_transport_does_not_park_or_end_the_session() -> None:
    hub, ended = _hub(60)
    session = SessionStub("t1")
    first = hub.add(session, "key")  # type: ignore[arg-type]
    _, second = hub.take("t1", "key")
    assert first.superseded.is_set() and not second.superseded.is_set()
    assert hub.park(session, first) and hub.parked == 0, "the old transport leaves the session to the new one"  # type: ignore[arg-type]
    assert not ended


async def test_with_resume_off_or_a_closed_session_nothing_is_parked() -> None:
    hub, _ = _hub(0)
    session = SessionStub("t1")
    assert not hub.park(session, hub.add(session, "key"))  # type: ignore[arg-type]
    hub, _ = _hub(60)
    closed = SessionStub("t2")
    closed.outbox.close()
    assert not hub.park(closed, hub.add(closed, "key"))  # type: ignore[arg-type]


async def test_closing_the_hub_cancels_the_timers() -> None:
    hub, ended = _hub(60)
    session = SessionStub("t1")
    hub.park(session, hub.add(session, "key"))  # type: ignore[arg-type]
    await hub.close()
    assert not ended
