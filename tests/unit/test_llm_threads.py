"""The adaptive 1-vs-N intra-op thread choice, with scripted timings (no model)."""

from __future__ import annotations

import pytest
import torch

from inference.cpu import using_cores
from inference.llm.threads import ThreadPolicy


@pytest.fixture(autouse=True)
def keep_threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


class Scripted(ThreadPolicy):
    """Probe ratios come from a list (the last one repeats)."""

    def __init__(self, ratios):
        super().__init__(2, interval_s=0.0)
        self.ratios = list(ratios)

    def _measure(self):
        r = self.ratios.pop(0) if len(self.ratios) > 1 else self.ratios[0]
        return 1.0, r


def steps(policy, n, cost_by_threads, rows=1):
    used = []
    for _ in range(n):
        t = policy.before_step(rows)
        used.append(t)
        policy.after_step(rows, cost_by_threads[t])
    return used


def test_fixed_threads_never_probe():
    p = ThreadPolicy(2, fixed=1)
    assert steps(p, 3, {1: 0.05}) == [1, 1, 1] and p.probes == 0


def test_single_core_is_fixed_at_one():
    p = ThreadPolicy(1)
    assert not p.adaptive and steps(p, 2, {1: 0.05}) == [1, 1]


def test_keeps_n_threads_while_they_pay_off():
    p = Scripted([0.55])
    used = steps(p, 60, {1: 0.080, 2: 0.045})
    assert used.count(1) <= 3 and used[-1] == 2  # only the exploring steps used 1 thread
    assert p.snapshot()["threads_decode"] == 2


def test_explores_less_often_while_exploring_keeps_losing():
    p = Scripted([0.55])
    used = steps(p, 600, {1: 0.080, 2: 0.045})
    assert 3 <= used.count(1) <= 5  # every 24 steps it would have been 25


def test_explores_and_switches_to_one_when_cheaper():
    p = Scripted([0.9])
    used = steps(p, 40, {1: 0.050, 2: 0.070})
    assert used[-1] == 1 and p.switches == 1
    # Conditions change: N threads pay off again; the next exploration finds it.
    used = steps(p, 45, {1: 0.050, 2: 0.030})
    assert used[-1] == 2 and p.switches == 2


def test_pathological_contention_never_runs_n_threads():
    p = Scripted([6.0])
    used = steps(p, 80, {1: 0.07, 2: 1.2})
    assert set(used) == {1}  # not even to explore: that would cost a one-second step
    assert p.pathological and p.snapshot()["threads_current"] == 1


def test_contention_that_passes_gives_every_kind_its_n_threads_back():
    p = Scripted([6.0, 6.0, 0.6])
    assert steps(p, 2, {1: 0.07, 2: 1.2}) == [1, 1]
    assert steps(p, 1, {1: 0.07, 2: 1.2}, rows=200) == [1]  # prefill too
    used = steps(p, 30, {1: 0.08, 2: 0.045})  # the average falls below the limit again
    assert not p.pathological and used.count(1) <= 2 and p.snapshot()["threads_decode"] == 2  # 1 only to explore
    assert steps(p, 1, {1: 0.2, 2: 0.12}, rows=200) == [2]  # without waiting for 24 prefill steps


def test_one_outlying_first_probe_does_not_put_the_engine_on_one_thread():
    """A new engine's first probe, with the process busy elsewhere for a moment, measured 2.5-4x."""
    p = Scripted([3.0, 0.6])
    assert steps(p, 3, {1: 0.08, 2: 0.045}) == [2, 2, 2]
    assert p.snapshot()["threads_batch"] == 2 and p.snapshot()["threads_prefill"] == 2


def test_kinds_are_separate():
    p = Scripted([0.9])
    steps(p, 40, {1: 0.050, 2: 0.070}, rows=1)  # decoding one stream: 1 thread wins
    used = steps(p, 40, {1: 0.200, 2: 0.120}, rows=200)  # prefill: N threads win
    assert p.snapshot()["threads_decode"] == 1 and p.snapshot()["threads_prefill"] == 2 and used[-1] == 2


def test_real_probe_runs():
    p = ThreadPolicy(2, interval_s=0.0, probe_weight=torch.randn(64, 128))
    p.before_step(1)
    assert p.probes == 1 and p.ratio > 0


def test_steps_leave_the_cores_whisper_or_piper_hold_and_do_not_count():
    p = Scripted([0.55])
    assert steps(p, 3, {1: 0.09, 2: 0.05}) == [2, 2, 2]
    with using_cores(1):
        # 1 thread looks 500x cheaper here: had these steps been recorded, the policy would switch to it.
        assert steps(p, 30, {1: 0.001, 2: 0.5}) == [1] * 30  # nothing explored, nothing learnt
    assert p.yielded_steps == 30
    assert steps(p, 3, {1: 0.09, 2: 0.05}) == [2, 2, 2]


def ahead_steps(policy, n, cost_by_threads, rows=1):
    used = []
    for _ in range(n):
        t = policy.before_step(rows, ahead=True)
        used.append(t)
        policy.after_step(rows, cost_by_threads[t])
    return used


def test_steps_ahead_of_their_listeners_run_on_the_threads_that_cost_fewest_core_seconds():
    p = Scripted([0.55])
    # 2 threads are faster (the steps a listener waits for use them) but cost 2 x 0.05 > 0.08 core-seconds.
    assert steps(p, 60, {1: 0.080, 2: 0.050})[-1] == 2
    assert ahead_steps(p, 5, {1: 0.080, 2: 0.050}) == [1] * 5 and p.ahead_steps == 5
    assert p.before_step(1) == 2  # a step someone waits for still takes the faster choice
    p.after_step(1, 0.05)
    # Were 2 threads more than twice as fast (2 x 0.03 < 0.08, measured), they would cost less and be used.
    p2 = Scripted([0.3])
    assert steps(p2, 60, {1: 0.080, 2: 0.030})[-1] == 2
    assert ahead_steps(p2, 3, {1: 0.080, 2: 0.030}) == [2, 2, 2]


def test_a_step_ahead_leaves_the_cores_whisper_or_piper_hold():
    p = Scripted([0.55])
    steps(p, 30, {1: 0.080, 2: 0.050})
    with using_cores(1):
        assert ahead_steps(p, 3, {1: 0.001, 2: 0.5}) == [1, 1, 1]
    assert p.ahead_steps == 0 and p.yielded_steps == 3
