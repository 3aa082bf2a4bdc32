"""The remote backend's circuit breaker (inference/llm/remote.py): a state machine on a fake clock."""

from __future__ import annotations

import pytest

from inference.llm import remote
from inference.llm.backend import BackendUnavailable


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    now = [100.0]
    monkeypatch.setattr(remote.time, "monotonic", lambda: now[0])
    return now


def test_it_opens_after_consecutive_failures_and_probes_once_after_the_cooldown(clock: list[float]) -> None:
    breaker = remote._Breaker(failures=3, cooldown_s=2.0)
    breaker.failed()
    breaker.failed()
    breaker.admit()  # two failures: still closed
    breaker.succeeded()
    for _ in range(3):
        breaker.failed()
    assert breaker.state == "open" and breaker.times_opened == 1
    with pytest.raises(BackendUnavailable) as refused:
        breaker.admit()
    assert refused.value.retry_after_s == pytest.approx(2.0)
    clock[0] += 2.1
    breaker.admit()  # the probe
    assert breaker.state == "half_open"
    with pytest.raises(BackendUnavailable):
        breaker.admit()  # one probe at a time
    breaker.failed()  # the probe failed: open again for a whole cool-down
    assert breaker.state == "open" and breaker.times_opened == 1
    clock[0] += 1.0
    with pytest.raises(BackendUnavailable):
        breaker.admit()
    clock[0] += 1.1
    breaker.admit()
    breaker.succeeded()
    assert breaker.state == "closed" and breaker.failures == 0
    breaker.admit()
    breaker.admit()
