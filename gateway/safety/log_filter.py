"""Personal data never reaches a log line: filters on the log handler keep what users say out of it.

- LibraryPayloads: the libraries' debug records that would print a payload print its size instead: a WebSocket
  frame (websockets, through uvicorn's logger too) and the parameters of aiosqlite's SQL (the stored messages).
- RedactPersonalData: e-mail addresses, phone numbers, payment cards and IBANs are redacted from every record,
  at every level, whatever --safety says: its message, its exception text, and its event fields
  (--log-content's `content` among them, to any depth). In a log, any token with an `@` and a domain is an
  address, whatever comes before it: a fragment of one (`...ermann@example.com`, cut short by a library) too.
"""

from __future__ import annotations

import functools
import logging

import regex
from websockets.frames import Frame, Opcode

from gateway.platform.config import DEFAULT_PHONE_REGION
from gateway.platform.log_redaction import RecordRedactor, RedactKeys
from gateway.safety.detectors import IBAN, PAYMENT_CARD, Detector, phone_detector
from gateway.safety.policy import Rule, SafetyPolicy

_TOKEN = r"[^\s\"'<>()\[\]{},;]*"
EMAIL_TOKEN = Detector("email", regex.compile(rf"{_TOKEN}@[A-Za-z0-9-]+\.{_TOKEN}"))


def log_filters(redact: RedactKeys, phone_region: str = DEFAULT_PHONE_REGION) -> list[logging.Filter]:
    """The log handler's filters, in their order (platform/event_log.py's configure installs them)."""
    return [LibraryPayloads(),  # WebSocket frames and SQL parameters: their sizes, not what users said
            redact,
            RedactPersonalData(phone_region)]  # e-mail, phone, card, IBAN: at every level, --log-content too


class RedactPersonalData(RecordRedactor):
    def __init__(self, phone_region: str = DEFAULT_PHONE_REGION) -> None:
        super().__init__()
        detectors = (EMAIL_TOKEN, PAYMENT_CARD, IBAN, phone_detector(phone_region))
        self.policy = SafetyPolicy([Rule(detector, "redact") for detector in detectors])

    def redact(self, text: str) -> str:
        return self.policy.screen(text).text


class LibraryPayloads(logging.Filter):
    """Replaces, in a record's arguments, a WebSocket frame by its opcode and size (a close frame stays: its code
    says why a session ended) and an aiosqlite call by its method and SQL, without the parameters."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple) and any(isinstance(arg, (Frame, functools.partial)) for arg in record.args):
            record.args = tuple(_summary(arg) for arg in record.args)
        return True


def _summary(arg: object) -> object:
    if isinstance(arg, Frame) and arg.opcode != Opcode.CLOSE:
        return f"{arg.opcode.name} [{len(arg.data)} bytes{'' if arg.fin else ', continued'}]"
    if isinstance(arg, functools.partial):
        name = getattr(arg.func, "__name__", type(arg.func).__name__)
        sql = [repr(arg.args[0])] if arg.args and isinstance(arg.args[0], str) else []
        rest = len(arg.args) - len(sql) + len(arg.keywords)
        return f"{name}({', '.join([*sql, f'<{rest} more arguments>'] if rest else sql)})"
    return arg
