"""The adaptive 1-vs-N intra-op thread choice, with scripted probe timings (no model)."""

from __future__ import annotations

import torch

from inference.llm.threads import ThreadPolicy


class Scripted(ThreadPolicy):
    def __init__(self, ratios):
        super().__init__(2, interval_s=0.0)
        self.ratios = list(ratios)

    def _measure(self):
        return 1.0, self.ratios.pop(0)


def run(policy, steps):
    return [policy.before_step(1) for _ in range(steps)]


def test_fixed_threads_never_probe():
    before = torch.get_num_threads()
    try:
        p = ThreadPolicy(2, fixed=1)
        assert run(p, 3) == [1, 1, 1] and p.probes == 0
    finally:
        torch.set_num_threads(before)


def test_switches_to_one_thread_under_contention_and_back():
    before = torch.get_num_threads()
    try:
        p = Scripted([0.55, 0.6, 6.0, 8.0, 5.0] + [0.5] * 5)
        assert run(p, 2) == [2, 2]  # N threads pay off
        assert run(p, 3) == [1, 1, 1]  # a busy machine makes N threads much slower: 1 at once
        used = run(p, 5)
        assert used[0] == 1 and used[-1] == 2 and p.switches == 2  # back to N once it clearly pays off
        snap = p.snapshot()
        assert snap["threads_current"] == 2 and snap["threads_probes"] == 10
    finally:
        torch.set_num_threads(before)


def test_single_core_is_fixed_at_one():
    before = torch.get_num_threads()
    try:
        p = ThreadPolicy(1)
        assert not p.adaptive and run(p, 2) == [1, 1]
    finally:
        torch.set_num_threads(before)


def test_real_probe_runs():
    before = torch.get_num_threads()
    try:
        p = ThreadPolicy(2, interval_s=0.0, probe_weight=torch.randn(64, 128))
        p.before_step(1)
        assert p.probes == 1 and p.ratio > 0
    finally:
        torch.set_num_threads(before)
