"""Realtime transcription sessions (session.type "transcription") on the real gateway: over a WebSocket as the
openai SDK opens one (?intent=transcription), from a client secret minted with that type, and over WebRTC.
They transcribe every turn and never respond; every event validates against the SDK's types."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import httpx
import numpy as np
import pytest
from aiortc import RTCSessionDescription
from openai import AsyncOpenAI
from openai.types.realtime import ClientSecretCreateResponse, RealtimeTranscriptionSessionCreateRequest

from inference.tts import TtsEngine
from media.resample import resample
from tests.conftest import QUESTION
from tests.gateway_process import GatewayProcess
from tests.integration.realtime_client import RealtimeClient
from tests.integration.sdk_types import assert_valid_server_event
from tests.integration.speech import HEARD_AS_SAID, encode_chunks, heard_as, with_silence
from tests.integration.test_webrtc_call import RATE, Caller, hangups  # noqa: F401
from tests.integration.webrtc_peer import loopback_ice  # noqa: F401  (an autouse fixture)
from tests.peers import PacedClipTrack

TRANSCRIPTION = {"model": "gpt-4o-transcribe", "language": "en"}


@pytest.fixture(scope="module")
def question_24k(tts: TtsEngine, question_pcm: np.ndarray) -> np.ndarray:
    return with_silence(resample(question_pcm, tts.sample_rate, 24000), 24000, 0.5, 1.2)


async def test_sdk_transcription_session_over_websocket(gateway: GatewayProcess, question_24k: np.ndarray) -> None:
    client = AsyncOpenAI(base_url=f"{gateway.url}/v1", api_key="unused", websocket_base_url=f"{gateway.ws_url}/v1")
    events: list[dict[str, Any]] = []

    async def until(connection: Any, kind: str, timeout: float = 60.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            raw = await asyncio.wait_for(connection.recv_bytes(), max(0.01, deadline - time.monotonic()))
            event = json.loads(raw)
            assert_valid_server_event(event)
            connection.parse_event(raw)  # and the SDK's own parser takes it
            events.append(event)
            if event["type"] == kind:
                return event

    async with client.realtime.connect(extra_query={"intent": "transcription"}) as connection:
        created = await until(connection, "session.created")
        assert created["session"]["type"] == "transcription"
        assert "output_modalities" not in created["session"] and "instructions" not in created["session"]
        await connection.send({"type": "session.update", "session": {
            "type": "transcription", "audio": {"input": {"transcription": TRANSCRIPTION}}}})
        updated = await until(connection, "session.updated")
        assert updated["session"]["audio"]["input"]["transcription"]["model"] == "gpt-4o-transcribe"
        for payload in encode_chunks(question_24k, 24000, "audio/pcm"):
            await connection.send({"type": "input_audio_buffer.append", "audio": payload})
        completed = await until(connection, "conversation.item.input_audio_transcription.completed")
        assert heard_as(completed["transcript"], QUESTION) >= HEARD_AS_SAID, completed["transcript"]
        assert completed["usage"]["type"] == "duration" and completed["usage"]["seconds"] > 1
        await until(connection, "conversation.item.done")
        await connection.send({"type": "response.create"})
        error = await until(connection, "error")
        assert "creates no responses" in error["error"]["message"]
        await connection.send({"type": "session.update", "session": {"instructions": "Answer."}})
        refused = await until(connection, "error")
        assert refused["error"]["param"] == "session.instructions"
        await connection.send({"type": "session.update", "session": {"audio": {"input": {"transcription": None}}}})
        assert (await until(connection, "error"))["error"]["param"] == "session.audio.input.transcription"
        await asyncio.sleep(1.0)  # nothing more comes: no response was started for the turn
        with pytest.raises(asyncio.TimeoutError):
            await until(connection, "response.created", timeout=0.5)
    kinds = [event["type"] for event in events]
    assert not [kind for kind in kinds if kind.startswith("response.")], kinds
    assert "input_audio_buffer.speech_started" in kinds and "input_audio_buffer.committed" in kinds
    # The partial transcripts while the question was spoken (0.9 s apart) come before the final one.
    assert kinds.index("conversation.item.input_audio_transcription.completed") > kinds.index("input_audio_buffer.committed")
    await client.close()


async def test_client_secret_for_a_transcription_session(gateway: GatewayProcess, question_24k: np.ndarray) -> None:
    client = AsyncOpenAI(base_url=f"{gateway.url}/v1", api_key="unused")
    secret = await client.realtime.client_secrets.create(
        session={"type": "transcription", "audio": {"input": {"transcription": TRANSCRIPTION,  # type: ignore[typeddict-item]
                                                              "turn_detection": {"type": "server_vad",
                                                                                 "silence_duration_ms": 500}}}})
    await client.close()
    raw = secret.model_dump(exclude_unset=True)
    ClientSecretCreateResponse.model_validate(raw, strict=False)  # the SDK's type, session.id included
    assert raw["session"].pop("object") == "realtime.transcription_session"
    session_id = raw["session"].pop("id")  # the id the session it opens will have
    # The session it will open, as session.created will show it.
    RealtimeTranscriptionSessionCreateRequest.model_validate(raw["session"])
    assert raw["session"]["type"] == "transcription" and set(raw["session"]) == {"type", "audio", "include"}
    realtime = await RealtimeClient.connect(f"{gateway.ws_url}/v1/realtime",
                                            headers={"authorization": f"Bearer {secret.value}"})
    try:
        created = await realtime.wait_for("session.created")
        assert created["session"]["type"] == "transcription" and created["session"]["id"] == session_id
        assert created["session"]["audio"]["input"]["turn_detection"]["silence_duration_ms"] == 500
        for payload in encode_chunks(question_24k, 24000, "audio/pcm"):
            await realtime.send({"type": "input_audio_buffer.append", "audio": payload})
        completed = await realtime.wait_for("conversation.item.input_audio_transcription.completed")
        assert heard_as(completed["transcript"], QUESTION) >= HEARD_AS_SAID, completed["transcript"]
        await asyncio.sleep(1.0)
        while True:  # what else arrived: never a response
            try:
                await realtime.recv(timeout=0.2)
            except TimeoutError:
                break
        assert not [e for e in realtime.events if e["type"].startswith("response.")]
    finally:
        await realtime.close()


async def test_type_changes_only_before_the_first_item(gateway: GatewayProcess) -> None:
    realtime = await RealtimeClient.connect(f"{gateway.ws_url}/v1/realtime")
    try:
        await realtime.wait_for("session.created")
        await realtime.send({"type": "session.update", "session": {"type": "transcription"}})
        assert (await realtime.wait_for("session.updated"))["session"]["type"] == "transcription"
        await realtime.send({"type": "conversation.item.create", "item": {
            "type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hello"}]}})
        await realtime.wait_for("conversation.item.done")
        await realtime.send({"type": "session.update", "session": {"type": "realtime"}})
        assert (await realtime.wait_for("error"))["error"]["param"] == "session.type"
    finally:
        await realtime.close()
    unknown = await RealtimeClient.connect(f"{gateway.ws_url}/v1/realtime?intent=translation")
    try:
        assert (await unknown.wait_for("error"))["error"]["param"] == "intent"
    finally:
        await unknown.close()


async def offer_with_session_part(gateway: GatewayProcess, microphone: PacedClipTrack, session: dict[str, Any]) -> Caller:
    """A call whose session comes in the offer's multipart `session` part, as a browser's backend posts it."""
    caller = Caller.open(microphone)
    pc = caller.pc
    await pc.setLocalDescription(await pc.createOffer())
    async with httpx.AsyncClient(base_url=gateway.url, timeout=30) as http:
        answer = await http.post("/v1/realtime/calls", files={"sdp": (None, pc.localDescription.sdp),
                                                               "session": (None, json.dumps(session))})
    assert answer.status_code == 201, answer.text
    caller.call_url = answer.headers["location"]
    await pc.setRemoteDescription(RTCSessionDescription(sdp=answer.text, type="answer"))
    await asyncio.wait_for(caller.opened.wait(), 10)
    return caller


async def test_transcription_call_over_webrtc(
    gateway: GatewayProcess, hangups: list[Caller], tts: TtsEngine, question_pcm: np.ndarray  # noqa: F811
) -> None:
    """/v1/realtime/calls keeps the session part's type: the call transcribes and never speaks."""
    speech = with_silence(resample(question_pcm, tts.sample_rate, RATE), RATE, 0.6, 0.0)
    caller = await offer_with_session_part(gateway, PacedClipTrack(speech), {
        "type": "transcription", "audio": {"input": {"transcription": TRANSCRIPTION}}})
    hangups.append(caller)
    assert (await caller.wait_for("session.created"))["session"]["type"] == "transcription"
    completed = await caller.wait_for("conversation.item.input_audio_transcription.completed")
    assert heard_as(completed["transcript"], QUESTION) >= HEARD_AS_SAID, completed["transcript"]
    await asyncio.sleep(1.5)
    kinds = [event["type"] for event in caller.events]
    assert not [kind for kind in kinds if kind.startswith(("response.", "output_audio_buffer."))], kinds
