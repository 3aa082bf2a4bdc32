"""Admission by measured capacity against a real gateway: once its voice turns run over the bound, a new
session is refused before the upgrade (WebSocket) or any SDP work (WebRTC) with 503 and Retry-After, the open
session goes on, and sessions are taken again once the slow turns have left the window."""

from __future__ import annotations

import asyncio
import base64
import json
import time
from collections.abc import Iterator

import httpx
import numpy as np
import pytest
import websockets

from inference.tts import TtsEngine
from media.resample import resample
from tests.gateway_process import GatewayProcess, start_gateway
from tests.integration.realtime_client import RealtimeClient
from tests.integration.speech import with_silence

# Long enough that the three turns and the refusals fit in it on a loaded machine too (with 6 s, the window had
# passed before the WebRTC refusal under two CPU hogs); the test then waits it out to see sessions taken again.
WINDOW_S = 30


@pytest.fixture(scope="module")
def strict(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    """A bound no voice turn meets (1 ms), judged over a short window."""
    process = start_gateway("--admission-latency-ms", "1", "--admission-window-s", str(WINDOW_S),
                            log_path=tmp_path_factory.mktemp("admission") / "gateway.log")
    yield process
    process.stop()


async def spoken_turn(client: RealtimeClient, speech: np.ndarray) -> dict:
    """A voice turn the server's VAD ends (the question, then silence; sent at once), and its spoken reply."""
    await client.send({"type": "input_audio_buffer.append", "audio": base64.b64encode(speech.tobytes()).decode()})
    return await client.wait_for("response.done", timeout=90)


async def admission(gateway: GatewayProcess) -> dict:
    async with httpx.AsyncClient(base_url=gateway.url, timeout=30) as http:
        return (await http.get("/healthz")).json()["admission"]


async def test_a_replica_at_capacity_refuses_new_sessions_and_takes_them_again(
        strict: GatewayProcess, tts: TtsEngine, question_pcm: np.ndarray) -> None:
    speech = with_silence(resample(question_pcm, tts.sample_rate, 24000), 24000, 0.3, 1.0)
    client = await RealtimeClient.connect(f"{strict.ws_url}/v1/realtime")
    try:
        assert (await client.recv())["type"] == "session.created"
        await client.send({"type": "session.update", "session": {"max_output_tokens": 6}})
        await client.wait_for("session.updated")
        assert (await admission(strict))["accepting"] is True
        for _ in range(3):
            done = await spoken_turn(client, speech)
            assert done["response"]["status"] in ("completed", "incomplete")
        state = await admission(strict)
        assert state["accepting"] is False and state["latency_p90_ms"] >= 1 and state["turns_in_window"] == 3, (state, done)
        # A new WebSocket: 503 during the handshake, OpenAI's body, and when to come back.
        with pytest.raises(websockets.InvalidStatus) as refused:
            await RealtimeClient.connect(f"{strict.ws_url}/v1/realtime")
        response = refused.value.response
        assert response.status_code == 503 and 1 <= float(response.headers["retry-after"]) <= WINDOW_S
        assert json.loads(response.body or b"")["error"]["code"] == "server_at_capacity"
        # A WebRTC call too, before its SDP is looked at.
        async with httpx.AsyncClient(base_url=strict.url, timeout=30) as http:
            call = await http.post("/v1/realtime/calls", content="v=0\r\n", headers={"content-type": "application/sdp"})
        assert call.status_code == 503 and call.json()["error"]["code"] == "server_at_capacity"
        # The session already open keeps going.
        assert (await client.ask("Say hi."))["response"]["status"] in ("completed", "incomplete")
        assert (await admission(strict))["refused"] == 2
        # No more slow turns: once they have left the window, a session is taken again.
        deadline = time.monotonic() + WINDOW_S + 10
        while not (await admission(strict))["accepting"]:
            assert time.monotonic() < deadline, "still refusing after the window"
            await asyncio.sleep(0.5)
        again = await RealtimeClient.connect(f"{strict.ws_url}/v1/realtime")
        assert (await again.recv())["type"] == "session.created"
        await again.close()
    finally:
        await client.close()
