"""Resuming a Realtime session over WebSocket after the connection drops: the events after the
client's last sequence number, then the live stream, with no duplicates and no gaps, in the middle
of a streaming response that went on generating while the client was away."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import websockets

from tests.gateway_process import GatewayProcess
from tests.integration.conftest import MODEL
from tests.integration.realtime_client import RealtimeClient

LONG_ANSWER = {"type": "session.update", "session": {"output_modalities": ["text"], "temperature": 0, "max_output_tokens": 200}}
QUESTION = {"type": "conversation.item.create", "item": {"type": "message", "role": "user",
            "content": [{"type": "input_text", "text": "Write a long story about a dragon who learns to bake bread."}]}}


async def _open(gateway: GatewayProcess) -> tuple[RealtimeClient, str]:
    client = await RealtimeClient.connect(f"{gateway.ws_url}/v1/realtime?model={MODEL}")
    created = await client.recv()
    assert created["type"] == "session.created" and created["sequence_number"] == 1
    token = created["resume_token"]
    assert isinstance(token, str) and len(token) >= 32
    await client.send(LONG_ANSWER)
    await client.wait_for("session.updated")
    return client, token


def _drop(client: RealtimeClient) -> None:
    """The network goes away: no close frame, as when a phone changes networks."""
    client.connection.transport.abort()


async def _until_done(client: RealtimeClient) -> list[dict[str, Any]]:
    events = []
    while True:
        events.append(await client.recv(timeout=60))
        if events[-1]["type"] == "response.done":
            return events


async def test_a_dropped_connection_resumes_in_the_middle_of_a_response(gateway: GatewayProcess) -> None:
    client, token = await _open(gateway)
    await client.send(QUESTION)
    await client.send({"type": "response.create"})
    while len(deltas := client.of_type("response.output_text.delta")) < 13:
        await client.recv()
    before = list(client.events)
    last_sequence = before[-1]["sequence_number"]
    _drop(client)
    # The reply goes on generating meanwhile, for about 40 tokens at this host's own pace: several tokens on a busy
    # 2-core host (a fixed 0.3 s left one in a CI run), and far short of the 200 tokens' end on a fast one (a fixed
    # 1 s outlasted the whole reply on an AVX-512 Zen 4, so nothing came live after the replay).
    per_token_s = (deltas[12]["_received_at"] - deltas[2]["_received_at"]) / 10
    await asyncio.sleep(min(4.0, max(0.05, 40 * per_token_s)))

    resumed = await RealtimeClient.connect(
        f"{gateway.ws_url}/v1/realtime?resume={token}&last_sequence={last_sequence}")
    first = await resumed.recv()
    assert first["sequence_number"] == last_sequence + 1, "exactly the events after the last one received"
    after = [first, *await _until_done(resumed)]

    sequences = [event["sequence_number"] for event in before + after]
    assert sequences == list(range(1, len(sequences) + 1)), "no duplicates and no gaps"
    done = after[-1]["response"]
    assert done["status"] in ("completed", "incomplete")  # incomplete: it used all 200 tokens
    streamed = "".join(e["delta"] for e in before + after if e["type"] == "response.output_text.delta")
    assert streamed == done["output"][0]["content"][0]["text"] and len(streamed) > 100
    # The deltas waiting at once show the reply went on while the client was away; then it goes live.
    waiting = [e for e in after if e["_received_at"] - first["_received_at"] < 0.1]
    assert len([e for e in waiting if e["type"] == "response.output_text.delta"]) >= 3
    assert len(waiting) < len(after), "the resumed connection gets the live stream after the replay"
    print(f"resume: {len(before)} events before the drop, {len(after)} after it "
          f"({len(waiting)} of them replayed at once), last_sequence={last_sequence}")

    # The session is the same one: its conversation holds the story in the next prompt.
    done = await resumed.ask("Say the word 'yes'.", max_output_tokens=5)
    assert done["response"]["usage"]["input_tokens"] > len(streamed) // 8
    await resumed.close()


async def test_a_second_connection_takes_the_session_over(gateway: GatewayProcess) -> None:
    client, token = await _open(gateway)
    last_sequence = client.events[-1]["sequence_number"]
    second = await RealtimeClient.connect(f"{gateway.ws_url}/v1/realtime?resume={token}&last_sequence={last_sequence}")
    with pytest.raises(websockets.ConnectionClosed) as closed:
        await client.recv(timeout=10)
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 4000
    done = await second.ask("Say the word 'yes'.", max_output_tokens=5)
    assert done["response"]["output"] and done["sequence_number"] > last_sequence
    await second.close()


async def _refused(url: str) -> tuple[str, int]:
    client = await RealtimeClient.connect(url)
    error = await client.recv()
    assert error["type"] == "error"
    with pytest.raises(websockets.ConnectionClosed) as closed:
        await client.recv(timeout=10)
    assert closed.value.rcvd is not None
    return error["error"]["code"], closed.value.rcvd.code


async def test_a_closed_session_cannot_be_resumed(gateway: GatewayProcess) -> None:
    client, token = await _open(gateway)
    await client.close()  # a close frame: the client is done with it
    await asyncio.sleep(0.2)
    assert await _refused(f"{gateway.ws_url}/v1/realtime?resume={token}&last_sequence=1") == ("session_not_found", 1008)
    assert await _refused(f"{gateway.ws_url}/v1/realtime?resume=not-a-token") == ("session_not_found", 1008)


async def test_a_sequence_it_cannot_replay_is_refused_and_the_session_stays_resumable(gateway: GatewayProcess) -> None:
    client, token = await _open(gateway)
    last_sequence = client.events[-1]["sequence_number"]
    _drop(client)
    await asyncio.sleep(0.2)
    code, close_code = await _refused(f"{gateway.ws_url}/v1/realtime?resume={token}&last_sequence={last_sequence + 50}")
    assert (code, close_code) == ("resume_gap", 1013)
    assert await _refused(f"{gateway.ws_url}/v1/realtime?resume={token}&last_sequence=abc") == ("invalid_value", 1013)
    resumed = await RealtimeClient.connect(f"{gateway.ws_url}/v1/realtime?resume={token}&last_sequence={last_sequence}")
    done = await resumed.ask("Say the word 'yes'.", max_output_tokens=5)
    assert done["response"]["output"]
    await resumed.close()
