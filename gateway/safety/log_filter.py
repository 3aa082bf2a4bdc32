"""Personal data never reaches a log line: a filter on the log handler redacts e-mail addresses, phone numbers,
payment cards and IBANs from every record, at every level, whatever --safety says: its message (uvicorn's and
websockets' debug logs of frames included), its exception text, and its event fields (--log-content's
`content` among them, to any depth)."""

from __future__ import annotations

import logging
from typing import Any

from gateway.safety.detectors import PII_DETECTORS
from gateway.safety.policy import Rule, SafetyPolicy

_RECORD_ATTRS = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime"}


class RedactPersonalData(logging.Filter):
    def __init__(self) -> None:
        super().__init__()
        self.policy = SafetyPolicy([Rule(detector, "redact") for detector in PII_DETECTORS])

    def redact(self, text: str) -> str:
        return self.policy.screen(text).text

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a broken logging call: its parts, redacted one by one
            record.msg = self.redact(str(record.msg))
            record.args = tuple(self._value(arg) for arg in record.args) if isinstance(record.args, tuple) else ()
        else:
            clean = self.redact(message)
            if clean != message:
                record.msg, record.args = clean, ()
        for name, value in list(vars(record).items()):
            if name not in _RECORD_ATTRS:
                setattr(record, name, self._value(value))
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = self.redact(record.exc_text)
            record.exc_info = None  # formatters would print it anew, unredacted
        if record.stack_info:
            record.stack_info = self.redact(record.stack_info)
        return True

    def _value(self, value: Any) -> Any:
        if isinstance(value, str):
            return self.redact(value)
        if isinstance(value, bytes):
            return self.redact(value.decode("latin-1")).encode("latin-1")
        if isinstance(value, dict):
            return {key: self._value(item) for key, item in value.items()}
        if isinstance(value, (list, tuple)):
            return type(value)(self._value(item) for item in value)
        return value
