"""Keys never reach the log: a filter on every handler redacts them from each record, at every level.

uvicorn's WebSocket code logs the handshake's headers at debug level (`authorization: Bearer ...`,
the `openai-insecure-api-key.<key>` subprotocol) and request lines with their query strings.
Redacted everywhere: the configured API keys wherever they appear, any bearer token (a wrong
key a client sent may be a real key elsewhere), Authorization header values, key subprotocols,
`ek_...` client secrets, the values of key-like query parameters, and the query string of a logged request
line (a carrier's stream URL carries session instructions in it).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from typing import Any

REDACTED = "[redacted]"
_KEY_PARAMS = r"api[_-]?key|key|token|access[_-]?token|client[_-]?secret|secret|password|auth"
_PATTERNS = [
    (re.compile(r"(?i)(\bauthorization\b['\"]?\s*[:=,]\s*b?['\"]?)[^\r\n'\"]+"), r"\g<1>" + REDACTED),
    (re.compile(r"(?i)(\bbearer\s+)[^\s,;'\"]+"), r"\g<1>" + REDACTED),
    (re.compile(r"(?i)(openai-insecure-api-key\.)[^\s,;'\"]+"), r"\g<1>" + REDACTED),
    (re.compile(r"\bek_[A-Za-z0-9_-]+"), "ek_" + REDACTED),
    (re.compile(rf"(?i)([?&;](?:{_KEY_PARAMS})=)[^&\s'\"]*"), r"\g<1>" + REDACTED),
    # A request line's whole query string (uvicorn logs each WebSocket's): a carrier's stream URL carries the
    # session's instructions there, which are user text.
    (re.compile(r'("(?:WebSocket|GET|POST|PUT|PATCH|DELETE|HEAD|OPTIONS) [^"?\s]*\?)[^"\s]*'), r"\g<1>" + REDACTED),
]


_RECORD_ATTRS = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime"}


class RecordRedactor(logging.Filter):
    """Applies `redact` to everything a log record prints: its whole message (not the template: a
    placeholder may sit where a key would be, `?api_key=%s`, and an argument prints as its str() or
    repr()), its exception and stack text, and its event fields to any depth."""

    def redact(self, text: str) -> str:
        raise NotImplementedError

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a broken logging call: the handler reports its msg and args, redacted one by one
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
            record.exc_info = None  # formatters (the JSON one too) would format it anew, unredacted
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


class RedactKeys(RecordRedactor):
    def __init__(self, api_keys: Sequence[str] = ()) -> None:
        super().__init__()
        # Literal keys, longest first; a very short one would blank out ordinary words instead.
        self.api_keys = sorted({key for key in api_keys if len(key) >= 6}, key=len, reverse=True)

    def redact(self, text: str) -> str:
        for key in self.api_keys:
            text = text.replace(key, REDACTED)
        for pattern, replacement in _PATTERNS:
            text = pattern.sub(replacement, text)
        return text
