"""The policy on a reply as it streams: what the transports put between the engine's deltas and the client."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Protocol

from gateway.platform import metrics
from gateway.safety.hooks import ClassifierWatch
from gateway.safety.policy import Finding, SafetyPolicy

CLASSIFIER = Finding("classifier", "block", 0, 0)  # what `blocked` says when the classifier flagged the turn


class ContentFiltered(Exception):
    """The reply matched a block rule: its generation stops, and it ends `incomplete` / `content_filter`
    (chat: finish_reason "content_filter")."""

    def __init__(self, finding: Finding) -> None:
        super().__init__(refusal(finding))
        self.finding = finding


def refusal(finding: Finding) -> str:
    """What a stopped reply says of itself (chat: the message's `refusal`)."""
    return f"The reply was stopped by the content policy (rule: {finding.rule})."


class OutputGuard:
    """`feed()` each delta, send what it returns, and stop the generation once `blocked` is set; `flush()` and
    `await finish()` at the end, `await close()` always. With an empty policy and no classifier it passes the
    deltas through untouched, holding nothing back. The classifier (`watch`) stops the generation itself."""

    def __init__(self, policy: SafetyPolicy, watch: ClassifierWatch | None = None, *, json_output: bool = False) -> None:
        """`json_output`: the reply is constrained to JSON (a response_format, a forced call), which its labels keep."""
        self._filter = policy.stream(json_output=json_output) if policy else None
        self._watch = watch
        self._sent: list[str] = []
        self._counted = 0

    @property
    def blocked(self) -> Finding | None:
        if self._filter is not None and self._filter.blocked is not None:
            return self._filter.blocked
        return CLASSIFIER if self._watch is not None and self._watch.flagged is not None else None

    @property
    def text(self) -> str:
        """What was let through so far."""
        return "".join(self._sent)

    def expect_json(self) -> None:
        """Before the first delta: the reply turned out to be constrained to JSON."""
        if self._filter is not None:
            self._filter = self._filter.policy.stream(json_output=True)

    def start(self, question: str) -> None:
        """The user's message this reply answers: classified at once, beside the generation."""
        if self._watch is not None:
            self._watch.check(question)

    def feed(self, delta: str) -> str:
        if self.blocked is not None:
            return ""
        released = delta
        if self._filter is not None:
            released = self._filter.feed(delta)
            self._count()
        return self._send(released)

    def flush(self) -> str:
        if self._filter is None or self.blocked is not None:
            return ""
        released = self._filter.flush()
        self._count()
        return self._send(released)

    async def finish(self) -> None:
        """The reply is complete: the classifier's last verdicts (within its timeout); check `blocked` after."""
        if self._watch is not None and self.blocked is None:
            await self._watch.finish(self.text)

    async def close(self) -> None:
        if self._watch is not None:
            await self._watch.close()

    def check(self) -> None:
        """Raise ContentFiltered once a block rule matched or the classifier flagged the turn."""
        if (blocked := self.blocked) is not None:
            raise ContentFiltered(blocked)

    def _send(self, released: str) -> str:
        if released:
            self._sent.append(released)
            if self._watch is not None:
                self._watch.output(self.text)
        return released

    def _count(self) -> None:
        assert self._filter is not None
        findings = self._filter.findings
        for finding in findings[self._counted:]:
            metrics.SAFETY_FINDINGS.labels("output", finding.rule, finding.action).inc()
        self._counted = len(findings)


class DeltaStream(Protocol):
    def __aiter__(self) -> AsyncIterator[str]: ...

    def cancel(self) -> None: ...


async def guarded(stream: DeltaStream, guard: OutputGuard) -> AsyncIterator[str]:
    """The reply's text as the guard lets it through: the generation stops at once when a block rule matches;
    at the end the held tail follows and the classifier's last verdicts are awaited (check `guard.blocked`)."""
    async for delta in stream:
        if safe := guard.feed(delta):
            yield safe
        if guard.blocked is not None:
            stream.cancel()  # the engine ends it at its next step
            break
    if tail := guard.flush():
        yield tail
    await guard.finish()
