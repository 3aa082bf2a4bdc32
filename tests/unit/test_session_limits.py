"""The session watchdog's deadline: the earliest a session can expire, so it sleeps until then, not on a period."""

from __future__ import annotations

import asyncio
import math
import time
from dataclasses import dataclass, field
from typing import Any

from gateway.protocol.errors import ApiError
from gateway.realtime.session_limits import SessionLimits


@dataclass(eq=False)  # kept by identity, as a session is
class Watched:
    """What the watchdog reads of a session, and what it does to one that expires."""

    opened_at: float
    last_activity: float
    id: str = "sess_1"
    active: Any = None
    errors: list[ApiError] = field(default_factory=list)
    close_frame: tuple[int, str] | None = None

    def send_error(self, error: ApiError) -> None:
        self.errors.append(error)


async def _never_ends(session: Any) -> None:
    raise AssertionError("not expected to end")


def test_an_idle_session_expires_its_idle_limit_after_its_last_activity() -> None:
    limits = SessionLimits(600, 30, _never_ends)
    session = Watched(opened_at=1000.0, last_activity=1010.0)
    assert limits._deadline(session, 1015.0) == (1040.0, "session_idle_timeout")  # type: ignore[arg-type]


def test_a_running_response_counts_as_activity_until_it_ends() -> None:
    limits = SessionLimits(600, 30, _never_ends)
    session = Watched(opened_at=1000.0, last_activity=1010.0, active=object())
    assert limits._deadline(session, 1100.0) == (1130.0, "session_idle_timeout")  # type: ignore[arg-type]


def test_the_longest_duration_wins_when_it_comes_first_and_no_idle_limit_means_none() -> None:
    assert SessionLimits(60, 30, _never_ends)._deadline(
        Watched(opened_at=1000.0, last_activity=1040.0), 1041.0) == (1060.0, "session_expired")  # type: ignore[arg-type]
    deadline, _ = SessionLimits(math.inf, 0, _never_ends)._deadline(
        Watched(opened_at=1000.0, last_activity=1000.0), 5000.0)  # type: ignore[arg-type]
    assert deadline == math.inf


async def test_the_watchdog_ends_a_session_whose_response_ended_once_it_has_been_idle() -> None:
    """A response that runs past the first bound moves the idle deadline; once it ends, the session expires
    its idle limit after that end."""
    ended = asyncio.Event()

    async def end(session: Any) -> None:
        ended.set()

    limits = SessionLimits(600, 0.2, end)
    now = time.monotonic()
    session = Watched(opened_at=now, last_activity=now, active=object())
    limits.watch(session)  # type: ignore[arg-type]
    await asyncio.sleep(0.5)  # past the first bound, while the response runs
    assert not ended.is_set()
    session.active, session.last_activity = None, time.monotonic()
    await asyncio.wait_for(ended.wait(), 10)
    assert [e.code for e in session.errors] == ["session_idle_timeout"] and session.close_frame == (
        1000, "session_idle_timeout")
    assert time.monotonic() - session.last_activity >= 0.2
    await limits.close()
