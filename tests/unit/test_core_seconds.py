"""The core-seconds each kind of model work holds (inference/cpu.py), as /metrics exports them."""

from __future__ import annotations

import time

from prometheus_client import generate_latest

from gateway.bench.ladder import PROCESS, server_counters_in
from gateway.platform.metrics import REGISTRY
from inference.cpu import charge, core_seconds, cores_in_use, using_cores


def test_a_block_charges_its_work_its_wall_time_times_its_cores() -> None:
    before = core_seconds().get("test_work", 0.0)
    with using_cores(2, work="test_work"):
        assert cores_in_use() >= 2
        time.sleep(0.05)
    charged = core_seconds()["test_work"] - before
    assert 0.1 <= charged < 1.0  # 2 cores x at least 50 ms
    with using_cores(1):  # no work named: declared busy, charged to nothing
        pass
    assert core_seconds()["test_work"] - before == charged


def test_metrics_export_the_core_seconds_by_work_and_the_process_cpu() -> None:
    charge("test_export", 1.25)
    exported = server_counters_in(generate_latest(REGISTRY).decode())
    assert exported["test_export"] >= 1.25
    assert exported[PROCESS] > 0
