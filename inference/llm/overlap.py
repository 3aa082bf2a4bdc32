"""Overlapped decoding steps (vLLM v1's async scheduling, SGLang's overlap scheduler), on the static path.

Without overlap the device idles while the host reads a step's tokens, accepts them (detokenizing,
stop strings, delivery) and plans the next step. Here a step whose rows all decode and sample on the
device (greedy rows and rows with a temperature alone: ``DeviceSampler``) leaves its sampled ids on the
device and is *in flight*; the next step of the same rows is launched at once with those ids as its
inputs, and only then does the host read and accept the first one's tokens, while the device runs
the second. One step is in flight at most.

A row whose request ends at the step in flight (an EOS, a stop string) runs once more in the step
launched after it: that step stores the KV of the request's last real token (consistent with its
tokens, so the prefix cache may keep it) and samples a token nobody accepts. Where a request will
reach its last token (``max_new``) at the step in flight, the next one is not launched early.
Anything else (a request admitted, cancelled or paced out, a prompt chunk, a row sampled on the
host: top-k or top-p, a grammar, OpenAI's penalties) ends the overlap: the step in flight is accepted first, then the scheduler plans as usual.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .step_plan import Segment, StepPlan


@dataclass(eq=False)
class InFlight:
    """A launched step whose sampled ids the host has not read: ``ids`` on the device in the plan's row
    order, ``host`` their copy (asynchronous on a GPU, complete once ``copied`` is)."""

    plan: StepPlan
    ids: torch.Tensor
    host: torch.Tensor
    copied: torch.cuda.Event | None

    def tokens(self) -> list[int]:
        if self.copied is not None:
            self.copied.synchronize()  # the copy waits for the step; the step after it still runs
        return self.host.tolist()


class StepOverlap:
    """Launches steps in flight and says when the next step may follow one before it is read: the
    engine's helper, on its scheduler thread. Two pinned host buffers take turns (one step's ids may
    still be copying while the next step's are written)."""

    def __init__(self, device: torch.device, max_rows: int) -> None:
        self.device = device
        on_cuda = device.type == "cuda"
        self._buffers = [torch.zeros(max_rows, dtype=torch.long, pin_memory=on_cuda) for _ in range(2)]
        self._turn = 0
        self.steps = 0  # launched while the previous step was still in flight
        self.accept_seconds = 0.0  # the host's time accepting a step's tokens while the next one ran

    def in_flight(self, plan: StepPlan, ids: torch.Tensor) -> InFlight:
        """``plan`` launched, its rows' ids sampled into ``ids``: start their copy to the host."""
        if self.device.type != "cuda":
            return InFlight(plan, ids, ids, None)
        host = self._buffers[self._turn][: ids.shape[0]]
        self._turn ^= 1
        host.copy_(ids, non_blocking=True)
        copied = torch.cuda.Event()
        copied.record()
        return InFlight(plan, ids, host, copied)

    @staticmethod
    def next_plan(step: InFlight, running: int, now: float) -> StepPlan | None:
        """The step after ``step`` for the same rows, one position on, whose input ids are ``step``'s on
        the device (the plan's are placeholders); None where it must not be launched before the host has
        accepted ``step``'s tokens. ``running``: the scheduler's running requests."""
        plan = step.plan
        requests = plan.requests
        if running != len(requests):  # one admitted (it prefills) or one ended
            return None
        needed = 0
        for req in requests:
            if req.finished or req.cancel_requested or len(req.generated) + 2 > req.max_new:
                return None
            needed += req.not_needed_before <= now
        if 0 < needed < len(requests):  # the scheduler would leave the others out (paced)
            return None
        nxt = StepPlan(requests=list(requests), sampling=list(plan.sampling), logit_rows=list(plan.logit_rows),
                       ahead=needed == 0)
        nxt.segments = [Segment(s.slot, s.start + 1, 1) for s in plan.segments]
        nxt.positions = [p + 1 for p in plan.positions]
        nxt.token_ids = [0] * len(requests)
        return nxt

