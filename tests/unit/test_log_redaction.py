"""The log filter: every form in which a key reaches a log record comes out redacted."""

from __future__ import annotations

import logging
import sys

from gateway.platform.log_redaction import REDACTED, RedactKeys

KEY = "sk-configured-0123456789"


def record(msg: str, args: tuple[object, ...] = (), name: str = "uvicorn.error") -> logging.LogRecord:
    return logging.LogRecord(name, logging.DEBUG, __file__, 1, msg, args, None)


def formatted(rec: logging.LogRecord) -> str:
    assert RedactKeys([KEY]).filter(rec)
    return logging.Formatter().format(rec)


def test_headers_subprotocols_client_secrets_and_query_keys() -> None:
    cases = [
        record("< authorization: Bearer %s", ("sk-unknown-abc",)),
        record("< Authorization: Basic dXNlcjpwYXNz"),
        record("headers %s", ([(b"authorization", b"Bearer sk-unknown-abc")],)),
        record("< sec-websocket-protocol: realtime, openai-insecure-api-key.%s", ("ek_abcDEF123-_x",)),
        record("minted %(value)s", ({"value": "ek_abcDEF123-_x"},)),
        record("GET /v1/realtime?model=m&api_key=%s&token=t0k3n HTTP/1.1", ("sk-unknown-abc",)),
        record("the configured key %s in any text", (KEY,)),
    ]
    for rec in cases:
        text = formatted(rec)
        assert REDACTED in text, text
        for secret in ("sk-unknown-abc", "dXNlcjpwYXNz", "abcDEF123", "t0k3n", KEY):
            assert secret not in text, text


def test_a_request_lines_query_string_is_dropped() -> None:
    """uvicorn logs each WebSocket's path and query; a carrier's stream URL carries session instructions there."""
    rec = record('%s - "WebSocket %s" [accepted]', ("127.0.0.1:4000",
                 "/v1/telephony/plivo?session=%7B%22instructions%22%3A%22my+card+is+4111%22%7D&api_key=ek_x"))
    text = formatted(rec)
    assert '"WebSocket /v1/telephony/plivo?[redacted]" [accepted]' in text, text
    assert "instructions" not in text and "4111" not in text
    assert "/v1/realtime/calls" in formatted(record('"POST /v1/realtime/calls HTTP/1.1" 201'))  # no query: as it was


def test_tracebacks_and_plain_text() -> None:
    try:
        raise ValueError(f"rejected Bearer {KEY}")
    except ValueError:
        rec = logging.LogRecord("gateway", logging.ERROR, __file__, 1, "failed", (), sys.exc_info())
    assert KEY not in formatted(rec)
    assert formatted(record("model=%s took %d ms", ("smollm2", 12))) == "model=smollm2 took 12 ms"
