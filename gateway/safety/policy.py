"""The safety policy: rules (a detector and what to do on a match) applied to a whole text or, through
StreamFilter, to a reply as it streams.

`block`: the text may not reach the model (input) or the user (output). `redact`: the match is replaced
by its label (`[email]`) and the rest goes on.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import Literal

from gateway.safety.detectors import MAX_MATCH_CHARS, Detector

Action = Literal["block", "redact"]
CONTEXT_CHARS = 8  # released text kept for the patterns' look-behinds


@dataclass(frozen=True)
class Rule:
    detector: Detector
    action: Action


@dataclass(frozen=True)
class Finding:
    rule: str  # the detector's name
    action: Action
    start: int
    end: int


@dataclass
class Screened:
    """A text after the policy: `text` redacted; `blocked` the first block rule's finding, if any."""

    text: str
    findings: list[Finding] = field(default_factory=list)

    @property
    def blocked(self) -> Finding | None:
        return next((f for f in self.findings if f.action == "block"), None)

    @property
    def redacted(self) -> bool:
        return any(f.action == "redact" for f in self.findings)


def _resolve(findings: list[Finding]) -> list[Finding]:
    """Non-overlapping findings, earliest first (the longest of those that start together)."""
    kept: list[Finding] = []
    for finding in sorted(findings, key=lambda f: (f.start, -f.end)):
        if not kept or finding.start >= kept[-1].end:
            kept.append(finding)
    return kept


def _apply(text: str, findings: Sequence[Finding], rules: dict[str, Rule], offset: int = 0,
           quoted: Collection[Finding] = ()) -> str:
    """`text` with each finding replaced by its rule's label (a JSON string for those `quoted`)."""
    parts, at = [], offset
    for finding in findings:
        parts.append(text[at:finding.start])
        label = rules[finding.rule].detector.label
        parts.append(json.dumps(label) if finding in quoted else label)
        at = finding.end
    parts.append(text[at:])
    return "".join(parts)


class SafetyPolicy:
    def __init__(self, rules: Sequence[Rule]) -> None:
        self.rules = tuple(rules)
        self._by_name = {rule.detector.name: rule for rule in self.rules}

    def __bool__(self) -> bool:
        return bool(self.rules)

    def screen(self, text: str) -> Screened:
        """The whole of `text`: every finding, and the text with the redact rules' matches replaced."""
        findings = _resolve([Finding(rule.detector.name, rule.action, start, end)
                             for rule in self.rules for start, end in rule.detector.find(text)])
        blocked = [f for f in findings if f.action == "block"]
        redacted = [f for f in findings if f.action == "redact"]
        return Screened(_apply(text, redacted, self._by_name), blocked + redacted)

    def stream(self, *, json_output: bool = False) -> StreamFilter:
        return StreamFilter(self, json_output=json_output)


class JsonStrings:
    """Where a JSON text's strings are, as it streams: a label that replaces a match outside a string (a card
    number written as a JSON number) must be a string itself, or the JSON breaks."""

    def __init__(self) -> None:
        self.inside = False
        self.escaped = False

    def scan(self, text: str) -> list[bool]:
        """Whether each character of `text`, which follows what was advanced over, lies inside a string."""
        return self._walk(text)[0]

    def advance(self, text: str) -> None:
        _, self.inside, self.escaped = self._walk(text)

    def _walk(self, text: str) -> tuple[list[bool], bool, bool]:
        inside, escaped, marks = self.inside, self.escaped, []
        for char in text:
            marks.append(inside and not (char == '"' and not escaped))
            if not inside:
                inside = char == '"'
            elif escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                inside = False
        return marks, inside, escaped


class StreamFilter:
    """The policy on a reply as it streams: `feed()` each delta and send what it returns.

    Text is held back only while it may be the beginning of a match (a partial match of some rule's
    pattern running to the end of what has come so far: "john" may become "john@example.com"), and never more
    than the longest match (MAX_MATCH_CHARS); everything before it is released at once, redacted. A block
    rule's match stops the stream: `blocked` is set, the text before the match is released, and nothing after.
    """

    def __init__(self, policy: SafetyPolicy, *, json_output: bool = False) -> None:
        self.policy = policy
        self._json = JsonStrings() if json_output else None  # the reply is JSON (constrained): labels keep it so
        self._held = ""
        self._before = ""
        self.blocked: Finding | None = None
        self.released: list[str] = []  # everything returned, in order
        self.findings: list[Finding] = []  # every match acted on (redacted, or the one that blocked)

    @property
    def held(self) -> str:
        return self._held

    def feed(self, delta: str) -> str:
        if self.blocked is not None:
            return ""
        return self._release(self._held + delta, final=False)

    def flush(self) -> str:
        """The end of the reply: the held text, screened as complete."""
        if self.blocked is not None:
            return ""
        return self._release(self._held, final=True)

    def _release(self, pending: str, *, final: bool) -> str:
        text = self._before + pending
        start = len(self._before)
        hold_from = len(text)
        found: list[Finding] = []
        for rule in self.policy.rules:
            hold_from = self._scan(rule, text, start, final, hold_from, found)
        findings = _resolve(found)
        changed = True
        while changed:  # a match that runs into the held text waits for it
            changed = False
            for finding in findings:
                if finding.end > hold_from > finding.start:
                    hold_from, changed = finding.start, True
        findings = [f for f in findings if f.end <= hold_from]
        block = next((f for f in findings if f.action == "block"), None)
        if block is not None:
            self.blocked = block
            hold_from = block.start
            findings = [f for f in findings if f.end <= block.start]
        quoted: list[Finding] = []
        if self._json is not None:
            inside = self._json.scan(text[start:hold_from])
            quoted = [f for f in findings if not inside[f.start - start]]
            self._json.advance(text[start:hold_from])
        released = _apply(text[:hold_from], findings, self.policy._by_name, start, quoted)
        self.findings += findings + ([block] if block is not None else [])
        self._held = "" if block is not None else text[hold_from:]
        self._before = text[max(0, hold_from - CONTEXT_CHARS):hold_from]
        if released:
            self.released.append(released)
        return released

    @staticmethod
    def _scan(rule: Rule, text: str, start: int, final: bool, hold_from: int, found: list[Finding]) -> int:
        detector = rule.detector
        for match in detector.pattern.finditer(text, pos=start, partial=not final):
            if not final and (match.partial or match.end() == len(text)):
                # May go on (or only now begin): hold it, unless it is already longer than any match can be.
                if len(text) - match.start() <= MAX_MATCH_CHARS:
                    hold_from = min(hold_from, match.start())
                continue
            found += [Finding(detector.name, rule.action, match.start() + begin, match.start() + end)
                      for begin, end in detector.spans(match.group())]
        return hold_from

