"""inference/cpu.py: declared cores, and exclusive work that the LLM engine waits for."""

from __future__ import annotations

import threading
import time

from inference.cpu import cores_in_use, using_cores, wait_for_exclusive_work


def test_cores_are_counted_while_declared() -> None:
    assert cores_in_use() == 0
    with using_cores(1), using_cores(2, exclusive=True):
        assert cores_in_use() == 3
    assert cores_in_use() == 0


def test_shared_work_is_not_waited_for() -> None:
    with using_cores(2):
        assert wait_for_exclusive_work(1.0) == 0.0


def test_exclusive_work_is_waited_for_until_it_ends() -> None:
    entered, release = threading.Event(), threading.Event()

    def synthesize() -> None:
        with using_cores(2, exclusive=True):
            entered.set()
            release.wait(5)

    worker = threading.Thread(target=synthesize)
    worker.start()
    assert entered.wait(5)
    started = time.monotonic()
    threading.Timer(0.5, release.set).start()
    waited = wait_for_exclusive_work(5.0)
    # It returned because the work ended, not at its bound, and not before the work ended.
    assert release.is_set() and 0 < waited < 4.0
    assert time.monotonic() - started >= 0.5
    worker.join(5)
    assert cores_in_use() == 0


def test_the_wait_is_bounded() -> None:
    with using_cores(1, exclusive=True):
        started = time.monotonic()
        waited = wait_for_exclusive_work(0.1)
        assert 0.09 < waited < 1.0 and time.monotonic() - started < 1.0
