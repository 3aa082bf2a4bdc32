"""The log filter: personal data leaves every part of a record before any handler formats it."""

from __future__ import annotations

import functools
import io
import json
import logging

from gateway.platform.event_log import formatter
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
        # Whole fragments: the timestamp's microseconds may hold "4111" or "7946" by chance.
        assert "jo@example.com" not in line and "4111 1111" not in line and "20 7946" not in line
        assert "DE89" not in line
        assert "[email]" in line and "[payment_card]" in line and "[phone]" in line and "[iban]" in line
    record = json.loads(emit("json", "plain %d", 5, event="y", count=3))
    assert record["message"] == "plain 5" and record["count"] == 3  # what holds no personal data is untouched


def test_a_broken_logging_call_is_still_redacted() -> None:
    line = emit("text", "two %s %s", "jo@example.com")
    assert "jo@example.com" not in line


def test_a_fragment_of_an_address_is_redacted() -> None:
    """A library that cuts a long payload short leaves an address's end: any token with an `@` and a domain goes."""
    for text in ('TEXT \'{"type": "conversation.item.create", "text": "mail ...ermann@example.com"}\' [312 bytes]',
                 "cut at both ends: ...ermann@example.co...", "a name...fred.o'neil@mail.example.org"):
        line = emit("text", "< %s", text)
        assert "example" not in line and "ermann" not in line and "[email]" in line, line
    assert "[email]" not in emit("text", "at 5 @ 3 pm, user@localhost")  # no domain: kept


def test_library_payloads_become_sizes() -> None:
    """A WebSocket frame (websockets logs each one at debug level, through uvicorn's logger too) is logged as its
    opcode and size, and aiosqlite's calls as their SQL without the parameters (the stored messages)."""
    from websockets.frames import Close, Frame, Opcode

    from gateway.safety.log_filter import LibraryPayloads

    said = "My name is Bartholomew Quince"
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.addFilter(LibraryPayloads())
    logger = logging.getLogger("test.safety.payloads")
    logger.handlers, logger.propagate, logger.level = [handler], False, logging.DEBUG
    logger.debug("< %s", Frame(Opcode.TEXT, said.encode()))
    logger.debug("> %s", Frame(Opcode.BINARY, b"\x00" * 70000, fin=False))
    logger.debug("> %s", Frame(Opcode.CLOSE, Close(1000, "bye").serialize()))
    logger.debug("executing %s", functools.partial(print, "INSERT INTO messages VALUES (?, ?)", ("id", said)))
    assert said not in stream.getvalue() and "Bartholomew" not in stream.getvalue()
    assert stream.getvalue().splitlines() == [
        "< TEXT [29 bytes]", "> BINARY [70000 bytes, continued]", "> CLOSE 1000 (OK) bye [5 bytes]",
        "executing print('INSERT INTO messages VALUES (?, ?)', <1 more arguments>)"]
