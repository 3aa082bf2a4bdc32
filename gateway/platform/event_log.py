"""Structured logs: one record per event that matters, as one JSON line (or `key=value` text).

Events carry ids (request, session, response, conversation), the model, token counts, latency marks and
a status, and never the user's content: prompts, transcripts and answers reach the log only when
--log-content is on (for debugging). Every record, the gateway's, uvicorn's and the libraries', goes
through the root logger's one handler, where the libraries' payloads become their sizes, and keys
(log_redaction.py) and personal data (safety/log_filter.py) are redacted.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from pythonjsonlogger.core import RESERVED_ATTRS
from pythonjsonlogger.json import JsonFormatter

EVENTS = logging.getLogger("gateway.events")
# uvicorn adds `color_message`, its message with terminal colours: not for a log file.
_NOT_FIELDS = frozenset(RESERVED_ATTRS) | {"color_message"}
_STANDARD = _NOT_FIELDS | {"message", "asctime"}
_log_content = False  # set once at start by configure(); off unless --log-content


def log_event(event: str, /, *, content: Mapping[str, Any] | None = None, **fields: Any) -> None:
    """One `event` record with `fields` (None values left out); `content` (user text) only with --log-content."""
    extra: dict[str, Any] = {"event": event, **{name: value for name, value in fields.items() if value is not None}}
    if content is not None and _log_content:
        extra["content"] = dict(content)
    EVENTS.info(event, extra=extra)


class TextWithFields(logging.Formatter):
    """The human-readable form: the usual line, then the record's event fields as key=value."""

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        extras = {name: value for name, value in vars(record).items() if name not in _STANDARD}
        if not extras:
            return line
        fields = " ".join(f"{name}={value}" for name, value in extras.items() if name != "event")
        return f"{line} {fields}"


def formatter(log_format: str) -> logging.Formatter:
    if log_format == "json":
        return JsonFormatter("%(levelname)s %(name)s %(message)s", rename_fields={"levelname": "level", "name": "logger"},
                             reserved_attrs=list(_NOT_FIELDS), timestamp=True, json_ensure_ascii=False)
    return TextWithFields("%(asctime)s %(levelname)s %(name)s: %(message)s")


def _route_transformers_logs() -> None:
    """transformers writes to its own stderr handler, and draws progress bars there: in a server's log they
    are lines no pipeline can parse. Its records go to the root handler instead, and the bars are off."""
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_default_handler()
    transformers_logging.enable_propagation()
    transformers_logging.disable_progress_bar()


def configure(*, level: str, log_format: str, log_content: bool, filters: Sequence[logging.Filter]) -> dict[str, Any]:
    """Install the one handler on the root logger, with `filters` (the redactions: safety/log_filter.py's
    log_filters); returns uvicorn's log configuration, whose loggers hand their records to it (uvicorn's access
    log is off: the http.request event replaces it)."""
    global _log_content
    _log_content = log_content
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(formatter(log_format))
    for log_filter in filters:
        handler.addFilter(log_filter)
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    logging.captureWarnings(True)  # the libraries' warnings become records too, in the same format
    _route_transformers_logs()
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "loggers": {name: {"handlers": [], "level": level.upper(), "propagate": True}
                    for name in ("uvicorn", "uvicorn.error", "uvicorn.access")},
    }
