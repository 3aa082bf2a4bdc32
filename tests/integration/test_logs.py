"""The gateway's structured log, read from a real gateway's stderr: one JSON record per event that matters,
carrying the X-Request-ID, and no user content unless --log-content is on."""

from __future__ import annotations

import asyncio
import json
import re
import signal
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from inference.tts import TtsEngine
from tests.gateway_process import GatewayProcess, start_gateway
from tests.integration.conftest import API_KEY, MODEL
from tests.integration.realtime_client import RealtimeClient
from tests.integration.test_safety import speak

SECRET_PHRASE = "my parrot is called Bartholomew Quince"


def records(log_path: Path) -> list[dict[str, Any]]:
    """The log's JSON lines (a line that is not one fails the test: the default format is JSON)."""
    lines = [line for line in log_path.read_text(errors="replace").splitlines() if line.strip()]
    return [json.loads(line) for line in lines]


async def wait_for_record(log_path: Path, **match: Any) -> dict[str, Any]:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        found = [r for r in records(log_path) if all(r.get(key) == value for key, value in match.items())]
        if found:
            return found[-1]
        await asyncio.sleep(0.1)
    raise AssertionError(f"no log record with {match}")


async def test_requests_sessions_and_responses_are_json_records_without_user_text(gateway: GatewayProcess) -> None:
    async with httpx.AsyncClient(base_url=gateway.url, timeout=120) as http:
        chat = await http.post("/v1/chat/completions", headers={"x-request-id": "req-chat-under-test"}, json={
            "model": MODEL, "max_tokens": 8, "messages": [{"role": "user", "content": SECRET_PHRASE}]})
        assert chat.status_code == 200 and chat.headers["x-request-id"] == "req-chat-under-test"
        refused = await http.get("/v1/models/no-such-model?api_key=sk-leak-me-please")
        assert refused.status_code == 404
        minted = refused.headers["x-request-id"]

    client = await RealtimeClient.connect(f"{gateway.ws_url}/v1/realtime?model={MODEL}",
                                          headers={"x-request-id": "req-ws-under-test"})
    assert client.connection.response.headers["x-request-id"] == "req-ws-under-test"
    created = await client.wait_for("session.created")
    session_id = created["session"]["id"]
    await client.send({"type": "session.update", "session": {"type": "realtime", "output_modalities": ["text"]}})
    done = await client.ask(SECRET_PHRASE, max_output_tokens=8)
    await client.send({"type": "response.cancel"})  # nothing to cancel: an error event
    await client.wait_for("error")
    await client.close()

    completion = await wait_for_record(gateway.log_path, event="chat.completion", request_id="req-chat-under-test")
    assert completion["completion_id"] == chat.json()["id"]
    assert completion["status"] == "completed" and completion["model"] == MODEL
    assert completion["input_tokens"] > 5 and completion["output_tokens"] >= 1 and completion["ttft_ms"] > 0
    request = await wait_for_record(gateway.log_path, event="http.request", request_id="req-chat-under-test")
    assert request["route"] == "/v1/chat/completions" and request["status"] == 200 and request["duration_ms"] > 0
    unknown = await wait_for_record(gateway.log_path, event="http.request", request_id=minted)
    assert unknown["route"] == "/v1/models/{model_id}" and unknown["status"] == 404  # the template, not the path

    started = await wait_for_record(gateway.log_path, event="realtime.session.started", session_id=session_id)
    assert started["request_id"] == "req-ws-under-test" and started["transport"] == "websocket"
    response = await wait_for_record(gateway.log_path, event="realtime.response.done",
                                      response_id=done["response"]["id"])
    assert response["session_id"] == session_id and response["request_id"] == "req-ws-under-test"
    assert response["status"] in ("completed", "incomplete") and response["output_tokens"] >= 1
    assert response["latency_ms"]["first_token_ms"] >= 0 and response["conversation_id"]
    error = await wait_for_record(gateway.log_path, event="realtime.error", session_id=session_id)
    assert error["code"] == "response_cancel_not_active"
    ended = await wait_for_record(gateway.log_path, event="realtime.session.ended", session_id=session_id)
    assert ended["responses"] == 1 and ended["duration_s"] > 0

    text = gateway.log_path.read_text(errors="replace")
    assert "Bartholomew" not in text and "sk-leak-me-please" not in text
    assert not any("content" in record for record in records(gateway.log_path))


async def test_content_logging_is_a_setting(secured_gateway: GatewayProcess) -> None:
    """The secured gateway runs with --log-content and --log-format text: the user's text is logged."""
    async with httpx.AsyncClient(base_url=secured_gateway.url, timeout=120) as http:
        chat = await http.post("/v1/chat/completions", headers={"authorization": f"Bearer {API_KEY}"}, json={
            "model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": SECRET_PHRASE}]})
    assert chat.status_code == 200
    request_id = chat.headers["x-request-id"]
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        lines = [line for line in secured_gateway.log_path.read_text(errors="replace").splitlines()
                 if "chat.completion" in line and f"request_id={request_id}" in line]
        if lines:
            break
        await asyncio.sleep(0.1)
    assert lines, "no chat.completion line for the request"
    assert SECRET_PHRASE in lines[0] and "status=completed" in lines[0]
    assert API_KEY not in secured_gateway.log_path.read_text(errors="replace")


# Personal data a session types and speaks. Their digits are unlike the log's own numbers (ports, sizes, times).
EMAILS = ("jane.roe@example.org", "maximilian.oberhuber-zimmermann@physics.example-university.edu")
PHONES = ("+1 415 555 0132", "+44 20 7946 0958")
CARD = "4929 7977 9979 7973"
IBAN = "DE80 7979 7979 7979 7979 79"
# Ends in the long address: websockets logs a long frame's start and end, and the address's end slipped through.
TYPED = f"Call {PHONES[0]} or {PHONES[1]}, my card is {CARD}, my IBAN is {IBAN}. Write to {EMAILS[0]} or {EMAILS[1]}"
# The numbers first: with AVX2 forced, the decoder went into a loop on the spelled-out address and the
# numbers after it never came (the check that they were heard as numbers failed, not the log's).
SPOKEN = f"My phone number is {PHONES[0]} and my card number is {CARD}. My e-mail is {EMAILS[0]}."


def strings(value: Any) -> list[str]:
    """A record's text: its string values at any depth (not its numbers: timings and counts the gateway measured)."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [text for key, item in value.items() if key != "timestamp" for text in strings(item)]
    if isinstance(value, list):
        return [text for item in value for text in strings(item)]
    return []


def personal_fragments(log_path: Path, process: GatewayProcess) -> list[str]:
    """Any 8 characters of the addresses, and any run of digits with 4 digits of the numbers in a row, in the
    log's text; its own numbers (ids, digests, addresses in memory, the ports, the pid, decimals and measures: a
    transcript's milliseconds, a frame's bytes) taken out first."""
    texts = []
    for line in log_path.read_text(errors="replace").splitlines():
        try:
            texts += strings(json.loads(line))
        except ValueError:  # not a record (nothing else should write there): all of it
            texts.append(line)
    text = "\n".join(texts)
    pieces = {address[i:i + 8] for address in EMAILS for i in range(len(address) - 7)}
    found = sorted(piece for piece in pieces if piece in text.lower())
    assert process.process is not None
    text = re.sub(r"\b0x[0-9a-f]+\b|\b[a-z]+_[0-9A-Za-z]{8,}\b|\b[0-9a-f-]{8,}\b", "", text)
    text = re.sub(r"\b127\.0\.0\.1:\d+|\b\d+\.\d+\b|\b\d+ ?(?:ms|s|bytes|MiB|positions)\b", "", text)
    text = text.replace(f"[{process.process.pid}]", "")
    numbers = [re.sub(r"\D", "", number) for number in (*PHONES, CARD, IBAN)]
    fours = {digits[i:i + 4] for digits in numbers for i in range(len(digits) - 3)}
    return found + [run for run in re.findall(r"\d{4,}", text) if any(run[i:i + 4] in fours for i in range(len(run) - 3))]


@pytest.fixture(scope="module")
def debug_gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    """Debug level, JSON: every library's records, WebSocket frames and SQL among them (its test stops it, to read
    the whole log)."""
    process = start_gateway("--log-level", "debug", "--log-format", "json",
                            log_path=tmp_path_factory.mktemp("debug-log") / "gateway.log")
    yield process
    process.stop()


async def test_a_debug_log_of_typed_and_spoken_personal_data_holds_no_fragment_of_it(
    debug_gateway: GatewayProcess, tts: TtsEngine
) -> None:
    """E-mail addresses (a long one: websockets cuts a long frame short, and its end slipped past the e-mail
    pattern), phone numbers, a card and an IBAN, typed into a chat completion (stored, plain and streamed) and a
    Realtime conversation.item.create, and spoken into input_audio_buffer.append: no fragment reaches the log."""
    try:
        async with httpx.AsyncClient(base_url=debug_gateway.url, timeout=120) as http:
            conversation = (await http.post("/backend-api/conversations", json={})).json()["id"]
            for stream in (False, True):
                answer = await http.post("/v1/chat/completions", json={
                    "model": MODEL, "max_tokens": 8, "stream": stream, "conversation": conversation,
                    "messages": [{"role": "user", "content": TYPED}]})
                assert answer.status_code == 200
        client = await RealtimeClient.connect(f"{debug_gateway.ws_url}/v1/realtime?model={MODEL}")
        await client.wait_for("session.created")
        await client.send({"type": "session.update", "session": {"type": "realtime", "output_modalities": ["text"]}})
        await client.ask(TYPED, max_output_tokens=8)
        client.events.clear()
        sender = asyncio.create_task(speak(client, tts, SPOKEN))
        transcribed = await client.wait_for("conversation.item.input_audio_transcription.completed", timeout=90)
        await client.wait_for("response.done", timeout=90)
        await sender
        await client.close()
        assert re.search(r"\d{3}", transcribed["transcript"]), transcribed  # the numbers were heard as numbers
    finally:
        debug_gateway.stop()
    assert personal_fragments(debug_gateway.log_path, debug_gateway) == []
    log = debug_gateway.log_path.read_text(errors="replace")
    assert "< TEXT" in log and "> TEXT" in log and "INSERT INTO" in log  # frames and SQL were logged: sizes only
    assert "[email]" not in log  # no content at all without --log-content: not even redacted


async def test_a_client_that_leaves_mid_body_is_one_quiet_line(gateway: GatewayProcess) -> None:
    """Headers with a Content-Length and half the body, then the socket closes: one INFO line and the request's
    record (499), no ERROR and no traceback."""
    request_id = "req-leaves-mid-body"
    body = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hello " * 20}]}).encode()
    with socket.create_connection((gateway.host, gateway.port)) as raw:
        raw.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: gateway\r\nContent-Type: application/json\r\n"
                    + f"X-Request-ID: {request_id}\r\nContent-Length: {len(body)}\r\n\r\n".encode()
                    + body[:len(body) // 2])
        await asyncio.sleep(0.3)
    request = await wait_for_record(gateway.log_path, event="http.request", request_id=request_id)
    assert request["status"] == 499
    log = records(gateway.log_path)
    said = [r for r in log if "disconnected before its request body was read" in r["message"]]
    assert len(said) == 1 and said[0]["level"] == "INFO"
    assert "POST /v1/chat/completions" in said[0]["message"]
    text = gateway.log_path.read_text(errors="replace")
    assert "ClientDisconnect" not in text and "Exception in ASGI application" not in text


@pytest.mark.parametrize("inherited", ["default", "ignored"])
def test_sigint_stops_the_gateway_with_one_line(tmp_path: Path, inherited: str) -> None:
    """Ctrl-C: uvicorn's shutdown lines, then one line that says so; no KeyboardInterrupt traceback. Also for a
    gateway started with SIGINT ignored, as a shell's background job is (uvicorn still catches it)."""
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN) if inherited == "ignored" else None
    try:
        process = GatewayProcess(tmp_path / "gateway.log", args=["--no-load-voice-models"]).start()  # inherits it
    finally:
        if previous is not None:
            signal.signal(signal.SIGINT, previous)
    try:
        process.wait_ready(240.0)
    except BaseException:
        process.stop()
        raise
    assert process.process is not None
    process.process.send_signal(signal.SIGINT)  # as Ctrl-C sends it
    assert process.process.wait(timeout=30) == 0
    text = process.log_path.read_text(errors="replace")
    assert "Traceback" not in text and "KeyboardInterrupt" not in text, text[-3000:]
    log = records(process.log_path)
    # The main thread logs these one after the other, each once, in this order, and the last of them is its
    # last line. Other threads' lines (the models' loader, the workers) may land between them on a busy
    # machine: where they land is not asserted.
    shutdown = ["Shutting down", "Waiting for application shutdown.", "Application shutdown complete.",
                f"Finished server process [{process.process.pid}]", "stopped by SIGINT"]
    assert [r["message"] for r in log if r["message"] in shutdown] == shutdown, text[-3000:]
    main_thread = [r for r in log if r["logger"] in ("uvicorn.error", "gateway")]
    assert main_thread[-1]["message"] == "stopped by SIGINT" and main_thread[-1]["level"] == "INFO"
