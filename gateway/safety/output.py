"""The policy on a reply as it streams: what the transports put between the engine's deltas and the client."""

from __future__ import annotations

from gateway import metrics
from gateway.safety.policy import Finding, SafetyPolicy


class ContentFiltered(Exception):
    """The reply matched a block rule: its generation stops, and it ends `incomplete` / `content_filter`
    (chat: finish_reason "content_filter")."""

    def __init__(self, finding: Finding) -> None:
        super().__init__(f"the reply was stopped by the content policy (rule: {finding.rule})")
        self.finding = finding


class OutputGuard:
    """`feed()` each delta, send what it returns, and stop the generation once `blocked` is set; `flush()` at
    the end. With an empty policy it passes the deltas through untouched, holding nothing back."""

    def __init__(self, policy: SafetyPolicy) -> None:
        self._filter = policy.stream() if policy else None
        self._counted = 0

    @property
    def blocked(self) -> Finding | None:
        return self._filter.blocked if self._filter is not None else None

    @property
    def text(self) -> str | None:
        """What was let through so far (None without a policy: then it is the model's text)."""
        return "".join(self._filter.released) if self._filter is not None else None

    def feed(self, delta: str) -> str:
        if self._filter is None:
            return delta
        released = self._filter.feed(delta)
        self._count()
        return released

    def flush(self) -> str:
        if self._filter is None:
            return ""
        released = self._filter.flush()
        self._count()
        return released

    def check(self) -> None:
        """Raise ContentFiltered once a block rule matched."""
        if (blocked := self.blocked) is not None:
            raise ContentFiltered(blocked)

    def _count(self) -> None:
        assert self._filter is not None
        findings = self._filter.findings
        for finding in findings[self._counted:]:
            metrics.SAFETY_FINDINGS.labels("output", finding.rule, finding.action).inc()
        self._counted = len(findings)
