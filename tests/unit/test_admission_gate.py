"""Admission by measured capacity (gateway/platform/admission.py): the 90th percentile of the open sessions' voice
turns in the window, against the bound set or, where a session alone exceeds it, 1.5x a lone session's turns."""

from __future__ import annotations

import pytest

from gateway.platform.admission import SOLO_HEADROOM, VoiceAdmission
from gateway.protocol.errors import ApiError


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def crowded(clock: Clock, bound_s: float = 1.0) -> VoiceAdmission:
    """Two sessions open (no lone session's turns measured yet)."""
    gate = VoiceAdmission(latency_bound_s=bound_s, window_s=30, clock=clock)
    gate.opened("a")
    gate.opened("b")
    return gate


def test_sessions_are_refused_while_the_open_sessions_slow_turns_are_over_the_bound_and_taken_again_after() -> None:
    clock = Clock()
    gate = crowded(clock)
    gate.record("a", 2.0)
    gate.record("b", 2.5)
    gate.check()  # two turns say nothing yet
    gate.record("a", 1.5)
    assert gate.at_capacity()
    with pytest.raises(ApiError) as refused:
        gate.check()
    error = refused.value
    assert (error.code, error.status, error.type) == ("server_at_capacity", 503, "server_error")
    assert "the 2 sessions open here" in error.message and "2500 ms" in error.message and "1000 ms" in error.message
    assert error.retry_after_s == 30.0  # the oldest slow turn leaves the window then
    clock.now += 10
    assert gate.retry_after_s() == 20.0
    for _ in range(27):  # fast turns: 3 slow ones of 30 are the 10% over the 90th percentile
        gate.record("b", 0.4)
    assert not gate.at_capacity()
    gate.check()
    assert gate.snapshot()["refused"] == 1 and gate.snapshot()["accepting"] is True


def test_slow_turns_leave_the_window_and_no_bound_takes_every_session() -> None:
    clock = Clock()
    gate = crowded(clock)
    for _ in range(5):
        gate.record("a", 3.0)
    assert gate.at_capacity() and gate.snapshot()["latency_p90_ms"] == 3000
    clock.now += 31
    assert not gate.at_capacity() and gate.snapshot()["turns_in_window"] == 0
    unbounded = crowded(clock, bound_s=0.0)
    for _ in range(5):
        unbounded.record("a", 30.0)
    unbounded.check()


def test_with_no_session_open_a_new_one_is_always_taken_and_ended_sessions_judge_nothing() -> None:
    clock = Clock()
    gate = crowded(clock)
    for _ in range(5):
        gate.record("a", 3.0)
    assert gate.at_capacity()
    gate.closed("a")  # the slow session ended: b's turns (none) judge now
    assert not gate.at_capacity() and gate.snapshot()["turns_in_window"] == 0
    gate.closed("b")
    gate.check()
    assert gate.snapshot()["sessions_open"] == 0
    gate.record("b", 9.0)  # a turn that ends after its session did counts for no one
    assert gate.snapshot()["turns_in_window"] == 0


def test_a_bound_a_lone_session_exceeds_by_itself_does_not_lock_the_replica() -> None:
    """A slower host than the bound was set for: one caller's own turns take 1.2 s against a 1 s bound. The
    replica takes a second; it refuses a third only once the two slow each other past 1.5x a lone session."""
    clock = Clock()
    gate = VoiceAdmission(latency_bound_s=1.0, window_s=30, clock=clock)
    gate.opened("a")
    for _ in range(4):
        gate.record("a", 1.2)
    assert gate.snapshot()["alone_latency_p90_ms"] == 1200
    assert gate.bound_s() == pytest.approx(SOLO_HEADROOM * 1.2)
    gate.check()  # the second caller is taken
    gate.opened("b")
    for _ in range(3):
        gate.record("b", 1.6)  # slower beside a, within 1.5x alone
    gate.check()
    assert gate.snapshot()["alone_latency_p90_ms"] == 1200  # b's turns ran beside a's: not a lone session's
    for _ in range(6):
        gate.record("a", 2.0)  # past 1.8 s
    with pytest.raises(ApiError, match="over the 1800 ms that protects them"):
        gate.check()
    # On a host that meets the bound alone, the bound set is the one judged.
    fast = VoiceAdmission(latency_bound_s=1.0, window_s=30, clock=clock)
    fast.opened("a")
    for _ in range(4):
        fast.record("a", 0.3)
    assert fast.bound_s() == 1.0
