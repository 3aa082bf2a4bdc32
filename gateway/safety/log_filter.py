"""Personal data never reaches a log line: a filter on the log handler redacts e-mail addresses, phone numbers,
payment cards and IBANs from every record, at every level, whatever --safety says: its message (uvicorn's and
websockets' debug logs of frames included), its exception text, and its event fields (--log-content's
`content` among them, to any depth)."""

from __future__ import annotations

from gateway.log_redaction import RecordRedactor
from gateway.safety.detectors import PII_DETECTORS
from gateway.safety.policy import Rule, SafetyPolicy


class RedactPersonalData(RecordRedactor):
    def __init__(self) -> None:
        super().__init__()
        self.policy = SafetyPolicy([Rule(detector, "redact") for detector in PII_DETECTORS])

    def redact(self, text: str) -> str:
        return self.policy.screen(text).text
