"""Admission by measured capacity (gateway/platform/admission.py): the 90th percentile of the window's voice turns."""

from __future__ import annotations

import pytest

from gateway.platform.admission import VoiceAdmission
from gateway.protocol.errors import ApiError


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_sessions_are_refused_while_the_windows_slow_turns_are_over_the_bound_and_taken_again_after() -> None:
    clock = Clock()
    gate = VoiceAdmission(latency_bound_s=1.0, window_s=30, clock=clock)
    gate.record(2.0)
    gate.record(2.5)
    gate.check()  # two turns say nothing yet
    gate.record(1.5)
    assert gate.at_capacity()
    with pytest.raises(ApiError) as refused:
        gate.check()
    error = refused.value
    assert (error.code, error.status, error.type) == ("server_at_capacity", 503, "server_error")
    assert error.retry_after_s == 30.0  # the oldest slow turn leaves the window then
    clock.now += 10
    assert gate.retry_after_s() == 20.0
    for _ in range(27):  # fast turns: 3 slow ones of 30 are the 10% over the 90th percentile
        gate.record(0.4)
    assert not gate.at_capacity()
    gate.check()
    assert gate.snapshot()["refused"] == 1 and gate.snapshot()["accepting"] is True


def test_slow_turns_leave_the_window_and_no_bound_takes_every_session() -> None:
    clock = Clock()
    gate = VoiceAdmission(latency_bound_s=1.0, window_s=30, clock=clock)
    for _ in range(5):
        gate.record(3.0)
    assert gate.at_capacity() and gate.snapshot()["latency_p90_ms"] == 3000
    clock.now += 31
    assert not gate.at_capacity() and gate.snapshot()["turns_in_window"] == 0
    unbounded = VoiceAdmission(latency_bound_s=0.0, clock=clock)
    for _ in range(5):
        unbounded.record(30.0)
    unbounded.check()
