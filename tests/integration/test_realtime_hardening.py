"""Malformed Realtime input over a real WebSocket: every message gets an `error` event and the session
goes on (it answers the next event and completes a text turn). Before, deep nesting and huge numbers
closed the session with 1000 "OK", and a lone surrogate in anything echoed left it open but mute."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import pytest

from tests.gateway_process import GatewayProcess
from tests.integration.conftest import MODEL
from tests.integration.realtime_client import RealtimeClient

MALFORMED = [
    ("deep nesting", "[" * 1000 + "]" * 1000, "invalid_json"),
    ("deep nesting in an event", '{"type": "session.update", "session": ' + "[" * 5000 + "]" * 5000 + "}", "invalid_json"),
    ("a 5,000-digit number", '{"type": "response.create", "response": {"max_output_tokens": ' + "9" * 5000 + "}}",
     "invalid_json"),
    ("a lone surrogate in the type", '{"type": "\\ud800"}', "invalid_json"),
    ("a lone surrogate in the event id", '{"type": "nope", "event_id": "e\\udfff"}', "invalid_json"),
    ("a lone surrogate in item text", json.dumps({"type": "conversation.item.create", "item": {
        "type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}}).replace("hi", "\\ud800"),
     "invalid_json"),
    ("a lone surrogate in instructions", '{"type": "session.update", "session": {"instructions": "x\\udc00"}}',
     "invalid_json"),
    ("max_output_tokens -5", '{"type": "response.create", "response": {"max_output_tokens": -5}}', "invalid_value"),
    ("max_output_tokens 0", '{"type": "response.create", "response": {"max_output_tokens": 0}}', "invalid_value"),
    ("instructions of 300,000 characters", json.dumps({"type": "session.update", "session": {"instructions": "x" * 300_000}}),
     "invalid_value"),
    ("response instructions of 300,000 characters",
     json.dumps({"type": "response.create", "response": {"instructions": "x" * 300_000}}), "invalid_value"),
]


@pytest.fixture
async def client(gateway: GatewayProcess) -> AsyncIterator[RealtimeClient]:
    client = await RealtimeClient.connect(f"{gateway.ws_url}/v1/realtime?model={MODEL}")
    await client.wait_for("session.created")
    await client.send({"type": "session.update", "session": {"output_modalities": ["text"], "max_output_tokens": 8}})
    await client.wait_for("session.updated")
    yield client
    await client.close()


async def _still_answers(client: RealtimeClient) -> None:
    await client.send({"type": "input_audio_buffer.clear", "event_id": "sentinel"})
    assert (await client.wait_for("input_audio_buffer.cleared", timeout=10))["type"]


async def test_malformed_events_get_an_error_and_the_session_goes_on(client: RealtimeClient) -> None:
    for name, raw, code in MALFORMED:
        await client.send(raw)
        error = await client.wait_for("error", timeout=10)
        assert error["error"]["code"] == code, (name, error)
        await _still_answers(client)
    done = await client.ask("What is the capital of France?")
    assert done["response"]["status"] in ("completed", "incomplete")


async def test_echoed_non_ascii_text_arrives_intact(client: RealtimeClient) -> None:
    """Server events are ASCII-only JSON: any text can be written, and it decodes to the same text."""
    text = "Grüße, 東京 😀"
    await client.send({"type": "conversation.item.create", "item": {
        "type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}})
    raw = await client.connection.recv()
    assert raw.isascii()
    assert json.loads(raw)["item"]["content"][0]["text"] == text


async def test_a_binary_frame_is_an_error_not_an_event(client: RealtimeClient) -> None:
    await client.connection.send(json.dumps({"type": "input_audio_buffer.clear"}).encode())
    error = await client.wait_for("error", timeout=10)
    assert error["error"]["code"] == "invalid_event"
    assert not client.of_type("input_audio_buffer.cleared")
    await _still_answers(client)
