"""What one engine step computes and what it gives back: the types the scheduler, the model runner and the
forward share (vLLM v1's ``SchedulerOutput`` and ``ModelRunnerOutput``).

The scheduler writes a :class:`StepPlan`; the model runner executes it, samples its rows and returns a
:class:`StepOutput`; the scheduler takes the tokens (``update_from_output``) and the engine delivers them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from .request import Request, RequestStatus


@dataclass
class Segment:
    """One request's part of a step: ``n`` new tokens written to ``slot`` from position ``start``."""

    slot: int
    start: int
    n: int


def leading_decodes(segments: Sequence[Segment]) -> int:
    """How many single-token (decoding) segments open the step: they come first, by slot, and run apart
    from the prompt chunks that follow (the static path, attention's layout)."""
    n = 0
    while n < len(segments) and segments[n].n == 1:
        n += 1
    return n


@dataclass
class StepPlan:
    """One step: ``segments[i]`` is ``requests[i]``'s new tokens (single-token segments first, by slot,
    then prompt chunks); ``token_ids`` and ``positions`` list the rows in that order. ``logit_rows``
    are the rows whose logits are needed, ``sampling[j]`` the request that samples from row
    ``logit_rows[j]``; ``prefill_done`` the requests whose prompt's KV this step completes."""

    requests: list[Request] = field(default_factory=list)
    segments: list[Segment] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    positions: list[int] = field(default_factory=list)
    logit_rows: list[int] = field(default_factory=list)
    sampling: list[Request] = field(default_factory=list)
    prefill_done: list[Request] = field(default_factory=list)
    # Every row a decode whose reader needs no token yet (a spoken reply ahead of its audio): nobody waits for it.
    ahead: bool = False

    @property
    def rows(self) -> int:
        return len(self.token_ids)

    @property
    def prefill_tokens(self) -> int:
        return sum(s.n for s, r in zip(self.segments, self.requests) if r.status is RequestStatus.PREFILLING)

    @property
    def end(self) -> int:
        """The longest position any slot reaches in this step."""
        return max(s.start + s.n for s in self.segments)

    @property
    def device_sampled(self) -> bool:
        """Every row decodes and samples on the device (greedy, or a temperature alone: DeviceSampler), so
        its ids may stay there (overlap.py)."""
        return (0 < self.rows == len(self.segments) == len(self.sampling) == len(self.logit_rows)
                and not self.prefill_done
                and all(r.sampler is not None and r.sampler.device_sampled for r in self.sampling))

    def alone(self, index: int) -> StepPlan:
        """The part of this step that is ``requests[index]``'s, as a step of its own (the model runner's
        fallback after a batched pass raised)."""
        r0 = sum(s.n for s in self.segments[:index])
        seg, req = self.segments[index], self.requests[index]
        return StepPlan(requests=[req], segments=[seg], token_ids=self.token_ids[r0 : r0 + seg.n],
                        positions=self.positions[r0 : r0 + seg.n],
                        logit_rows=[lr - r0 for lr in self.logit_rows if r0 <= lr < r0 + seg.n],
                        sampling=[r for r in self.sampling if r is req],
                        prefill_done=[r for r in self.prefill_done if r is req], ahead=self.ahead)


@dataclass
class StepOutput:
    """What the model runner gives back for a plan: ``tokens[i]`` is ``sampling[i]``'s sampled token, or
    the error its row's sampling raised; ``failed`` the requests whose forward raised (by ``id``), with
    the error, which neither sample nor complete a prefill; ``forward_seconds`` the time of its passes, the
    device's sampling with them but not the host's (the thread policy weighs threads by it, and the CPU account
    charges threads times it: the host samples on one thread)."""

    sampling: list[Request]
    tokens: list[int | Exception]
    failed: dict[int, tuple[Request, Exception]] = field(default_factory=dict)
    forward_seconds: float = 0.0
