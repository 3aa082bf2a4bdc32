"""The log filter: personal data leaves every part of a record before any handler formats it."""

from __future__ import annotations

import io
import json
import logging

from gateway.event_log import formatter
from gateway.safety.log_filter import RedactPersonalData


def emit(log_format: str, *args: object, **extra: object) -> str:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(formatter(log_format))
    handler.addFilter(RedactPersonalData())
    logger = logging.getLogger(f"test.safety.{log_format}")
    logger.handlers, logger.propagate, logger.level = [handler], False, logging.DEBUG
    try:
        raise ValueError("card 4111 1111 1111 1111 refused")
    except ValueError:
        logger.debug(*args, exc_info=True, extra=extra)  # type: ignore[arg-type]
    return stream.getvalue()


def test_message_arguments_fields_and_exception_are_redacted() -> None:
    for log_format in ("json", "text"):
        line = emit(log_format, "frame < %s", '{"text": "mail jo@example.com"}', event="x",
                    content={"last_user_message": ["call +44 20 7946 0958", {"iban": "DE89 3704 0044 0532 0130 00"}]})
        assert "jo@example.com" not in line and "4111" not in line and "7946" not in line and "DE89" not in line
        assert "[email]" in line and "[payment_card]" in line and "[phone]" in line and "[iban]" in line
    record = json.loads(emit("json", "plain %d", 5, event="y", count=3))
    assert record["message"] == "plain 5" and record["count"] == 3  # what holds no personal data is untouched


def test_a_broken_logging_call_is_still_redacted() -> None:
    line = emit("text", "two %s %s", "jo@example.com")
    assert "jo@example.com" not in line
