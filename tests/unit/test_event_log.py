"""The log's two formats, its content switch, and key redaction in JSON tracebacks, through a real handler."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator

import pytest

from gateway.platform import event_log
from gateway.platform.log_redaction import RedactKeys
from gateway.safety.log_filter import log_filters

KEY = "sk-configured-0123456789"


@pytest.fixture
def root_restored() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    for handler in list(root.handlers):
        root.removeHandler(handler)
    for handler in handlers:
        root.addHandler(handler)
    root.setLevel(level)
    logging.captureWarnings(False)
    event_log._log_content = False


def capture(log_format: str, log_content: bool) -> io.StringIO:
    event_log.configure(level="info", log_format=log_format, log_content=log_content, filters=log_filters(RedactKeys([KEY])))
    stream = io.StringIO()
    handler = logging.getLogger().handlers[0]
    assert isinstance(handler, logging.StreamHandler)
    handler.setStream(stream)
    return stream


@pytest.mark.usefixtures("root_restored")
def test_json_records_carry_fields_and_no_content_by_default() -> None:
    stream = capture("json", log_content=False)
    event_log.log_event("chat.completion", request_id="req_1", output_tokens=3, ttft_ms=None,
                        content={"output_text": "a secret answer"})
    record = json.loads(stream.getvalue())
    assert record["event"] == "chat.completion" and record["request_id"] == "req_1" and record["output_tokens"] == 3
    assert record["level"] == "INFO" and record["logger"] == "gateway.events" and "timestamp" in record
    assert "ttft_ms" not in record and "content" not in record and "secret answer" not in stream.getvalue()


@pytest.mark.usefixtures("root_restored")
def test_content_logging_and_the_text_format() -> None:
    stream = capture("text", log_content=True)
    event_log.log_event("realtime.transcription.completed", session_id="sess_1", content={"transcript": "hello there"})
    line = stream.getvalue()
    assert "realtime.transcription.completed session_id=sess_1" in line and "hello there" in line


@pytest.mark.usefixtures("root_restored")
def test_json_tracebacks_are_redacted() -> None:
    stream = capture("json", log_content=False)
    try:
        raise ValueError(f"rejected Bearer {KEY}")
    except ValueError:
        logging.getLogger("gateway").exception("failed")
    record = json.loads(stream.getvalue())
    assert "ValueError" in record["exc_info"] and KEY not in stream.getvalue()
