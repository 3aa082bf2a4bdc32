"""The gateway's structured log, read from a real gateway's stderr: one JSON record per event that matters,
carrying the X-Request-ID, and no user content unless --log-content is on."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import httpx

from tests.gateway_process import GatewayProcess
from tests.integration.conftest import API_KEY, MODEL
from tests.integration.realtime_client import RealtimeClient

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
