"""GPT-Live over WebRTC (`client.live.create()`, the official SDK, and an aiortc peer), its trusted sideband
(`client.live.sideband.connect()`) and its hangup (`client.live.sessions.hangup()`). Every server event, on the data
channel and on the sideband, is checked against openai.types.live as it arrives."""

from __future__ import annotations

import asyncio
import base64
import json
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import numpy as np
import pytest
import websockets
from aiortc import MediaStreamTrack, RTCSessionDescription
from openai import AsyncOpenAI

from inference.asr import AsrEngine
from inference.tts import TtsEngine
from media.frames import AudioChunk
from media.resample import resample
from tests.conftest import QUESTION
from tests.gateway_process import GatewayProcess, start_gateway
from tests.integration.live_client import RATE as LIVE_RATE
from tests.integration.live_client import LiveCaller
from tests.integration.sdk_types import assert_valid_live_event
from tests.integration.speech import HEARD_AS_SAID, heard_as, heard_within, transcribe, with_silence, words
from tests.integration.webrtc_peer import RATE, BrowserPeer, loopback_ice, loud  # noqa: F401  (an autouse fixture)
from tests.peers import PacedClipTrack


@dataclass
class LivePeer(BrowserPeer):
    """A browser's side of a Live WebRTC session."""

    session_id: str = ""
    contract = staticmethod(assert_valid_live_event)

    def said(self) -> str:
        return "".join(event["delta"] for event in self.of_type("session.output_transcript.delta"))


def client(gateway: GatewayProcess) -> AsyncOpenAI:
    return AsyncOpenAI(base_url=f"{gateway.url}/v1", api_key="sk-test")


async def create(gateway: GatewayProcess, microphone: MediaStreamTrack, session: dict[str, Any]) -> LivePeer:
    peer = LivePeer.open(microphone)
    pc = peer.pc
    await pc.setLocalDescription(await pc.createOffer())
    created = await client(gateway).live.create(session=session,  # type: ignore[arg-type]  # a dict, sent as it is
                                                transport={"type": "webrtc", "sdp": pc.localDescription.sdp})
    assert created.transport.type == "webrtc"
    peer.session_id = created.session.id
    await pc.setRemoteDescription(RTCSessionDescription(sdp=created.transport.sdp, type="answer"))
    await asyncio.wait_for(peer.opened.wait(), 10)
    return peer


@pytest.fixture
async def peers(gateway: GatewayProcess) -> AsyncIterator[list[LivePeer]]:
    created: list[LivePeer] = []
    yield created
    async with httpx.AsyncClient(base_url=gateway.url) as http:
        for peer in created:
            await http.post(f"/v1/live/sessions/{peer.session_id}/hangup")  # 404 once it has ended
            await peer.pc.close()


async def test_a_spoken_question_is_answered_on_the_track_with_its_words_on_the_data_channel(
    gateway: GatewayProcess, peers: list[LivePeer], tts: TtsEngine, asr: AsrEngine, question_pcm: np.ndarray
) -> None:
    speech = with_silence(resample(question_pcm, tts.sample_rate, RATE), RATE, 0.6, 0.0)
    peer = await create(gateway, PacedClipTrack(speech), {"model": "gpt-live-1",
                                                          "instructions": "Answer in one short sentence."})
    peers.append(peer)
    started = await peer.wait_for("session.started")
    assert peer.events[0]["type"] == "session.started", "the session starts as it is created"
    resource = started["session"]
    assert resource["id"] == peer.session_id and resource["model"] == "gpt-live-1"
    assert "format" not in resource["audio"], "WebRTC negotiates its audio format"
    assert not peer.of_type("info"), "no client capabilities: nothing to say of them"

    await peer.wait_for("session.output_transcript.delta", timeout=90)
    heard = "".join(event["delta"] for event in peer.of_type("session.input_transcript.delta"))
    assert heard_as(heard, QUESTION) >= HEARD_AS_SAID, heard
    await peer.wait_for("session.usage.updated", timeout=90)  # the reply was made
    # The words follow the audio the track plays: they stop coming when it does.
    while time.monotonic() - peer.of_type("session.output_transcript.delta")[-1]["_at"] < 2.0:
        await asyncio.sleep(0.1)
    said = peer.of_type("session.output_transcript.delta")
    assert words(peer.said())
    for event in said:
        assert 0 <= event["start_ms"] <= event["end_ms"], event
    assert [e["start_ms"] for e in said] == sorted(e["start_ms"] for e in said)
    assert not peer.of_type("session.output_audio.delta"), "the audio is the track's, not the data channel's"
    answer = peer.audio_between(said[0]["_at"] - 1.0, said[-1]["_at"] + 1.0)
    assert loud(answer)
    spoken = await transcribe(asr, AudioChunk(answer, RATE))
    assert heard_within(spoken, peer.said()) >= HEARD_AS_SAID, (spoken, peer.said())

    peer.send({"type": "session.start", "session": {"model": "gpt-live-1"}, "event_id": "evt_again"})
    again = await peer.wait_for("error")
    assert again["error"]["code"] == "session_already_started" and again["client_event_id"] == "evt_again"
    peer.send({"type": "session.input_audio.append", "audio": ""})
    assert (await peer.wait_for("error", count=2))["error"]["code"] == "unsupported_event"

    await client(gateway).live.sessions.hangup(peer.session_id)
    closed = await peer.wait_for("session.closed", timeout=10)
    assert closed["reason"] == "close_requested" and closed["session"]["id"] == peer.session_id
    await asyncio.wait_for(peer.closed.wait(), 10)  # then the data channel closes


@pytest.fixture(scope="module")
def short_sessions(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    process = start_gateway("--max-session-duration-s", "3", log_path=tmp_path_factory.mktemp("short") / "gateway.log")
    yield process
    process.stop()


async def test_an_expiring_session_says_so_on_the_data_channel_before_the_call_closes(
    short_sessions: GatewayProcess
) -> None:
    peer = await create(short_sessions, PacedClipTrack(np.zeros(0, np.int16)), {"model": "gpt-live-1"})
    try:
        await peer.wait_for("session.started")
        closed = await peer.wait_for("session.closed", timeout=15)
        assert closed["reason"] == "expired" and closed["session"]["id"] == peer.session_id
        expired = peer.of_type("error")
        assert expired and expired[-1]["error"]["code"] == "session_expired", peer.events
        assert peer.events.index(expired[-1]) < peer.events.index(closed)
        await asyncio.wait_for(peer.closed.wait(), 10)  # then the data channel closes
    finally:
        await peer.pc.close()


async def test_client_capabilities_restrict_the_data_channel_but_not_the_sideband(
    gateway: GatewayProcess, peers: list[LivePeer]
) -> None:
    capabilities = {"data_channel": {
        "allowed_client_events": ["session.update", "session.close"],
        "allowed_server_events": [{"type": t} for t in ("session.started", "session.updated", "info", "error")]}}
    peer = await create(gateway, PacedClipTrack(np.zeros(0, np.int16)), {"model": "gpt-live-1",
                                                                         "client": capabilities})
    peers.append(peer)
    started = await peer.wait_for("session.started")
    assert started["session"]["client"] == capabilities
    info = await peer.wait_for("info")
    assert info["code"] == "data_channel_permissions" and "session.update" in info["message"]

    peer.send({"type": "session.update", "session": {}, "event_id": "evt_update"})
    assert (await peer.wait_for("session.updated"))["client_event_id"] == "evt_update"
    peer.send({"type": "session.thinking.append", "content": "The user is in a hurry.", "event_id": "evt_thinking"})
    refused = await peer.wait_for("error")
    assert refused["error"]["code"] == "event_not_permitted" and refused["client_event_id"] == "evt_thinking"
    assert "session.thinking.append" in refused["error"]["message"]

    async with LiveCaller.attach(gateway.url, peer.session_id) as sideband:
        await sideband.send({"type": "session.thinking.append", "content": "The user is in a hurry.",
                             "event_id": "evt_sideband"})
        appended = await sideband.wait_for("session.thinking.appended")
        assert appended["client_event_id"] == "evt_sideband"
        peer.send({"type": "session.update", "session": {}, "event_id": "evt_after"})
        await peer.wait_for("session.updated", count=2)
        await sideband.wait_for("session.updated")  # the sideband hears what the front end does
    assert not peer.of_type("session.thinking.appended"), "not among the front end's allowed_server_events"
    assert {event["type"] for event in peer.events} <= {"session.started", "session.updated", "info", "error"}


async def test_a_sideband_hears_a_live_websocket_session_both_ways_and_steers_it(
    gateway: GatewayProcess, tts: TtsEngine, asr: AsrEngine, question_pcm: np.ndarray
) -> None:
    async with LiveCaller.connect(gateway.url, {"model": "gpt-live-1",
                                                "instructions": "Answer in one short sentence."}) as caller:
        session_id = (await caller.wait_for("session.started"))["session"]["id"]
        async with LiveCaller.attach(gateway.url, session_id) as sideband:
            await sideband.wait_for("session.input_audio.append")  # the microphone's silence, already
            caller.say(resample(question_pcm, tts.sample_rate, LIVE_RATE))
            await caller.wait_for("session.usage.updated", timeout=90)
            await caller.wait_for("session.output_audio.delta")
            while time.monotonic() - caller.of_type("session.output_audio.delta")[-1]["_at"] < 1.5:
                await asyncio.sleep(0.1)

            # The user's audio, reflected as mono PCM16LE at 24 kHz, without an id.
            reflected = sideband.of_type("session.input_audio.append")
            assert all("event_id" not in event for event in reflected)
            heard = np.frombuffer(b"".join(base64.b64decode(e["audio"]) for e in reflected), np.int16)
            assert heard_as(await transcribe(asr, AudioChunk(heard, LIVE_RATE)), QUESTION) >= HEARD_AS_SAID
            # The assistant's audio: what the primary WebSocket played, on the session's timeline.
            output = sideband.of_type("session.output_audio.delta")
            assert np.array_equal(sideband.audio(), caller.audio())
            for before, after in zip(output, output[1:], strict=False):
                assert 0 <= before["start_ms"] < before["end_ms"] <= after["start_ms"], (before, after)
            assert all("start_ms" not in event for event in caller.of_type("session.output_audio.delta"))
            assert sideband.of_type("session.output_transcript.delta"), "and the session's own events"

            await sideband.send({"type": "session.instructions.append", "content": "Be brief.",
                                 "event_id": "evt_steer"})
            assert (await sideband.wait_for("session.instructions.appended"))["client_event_id"] == "evt_steer"
            await caller.wait_for("session.instructions.appended")
            await sideband.send({"type": "session.input_audio.append", "audio": "", "event_id": "evt_audio"})
            refused = await sideband.wait_for("error")
            assert refused["error"]["code"] == "unsupported_event" and refused["client_event_id"] == "evt_audio"
            await sideband.send({"type": "transport.dtmf.send", "event": "1", "event_id": "evt_digit"})
            no_line = await sideband.wait_for("error", where=lambda event: event.get("client_event_id") == "evt_digit")
            assert no_line["error"]["code"] == "unsupported_event", no_line  # a WebSocket session has no phone line

            await client(gateway).live.sessions.hangup(session_id)
            closed = await caller.wait_for("session.closed", timeout=10)
            assert closed["reason"] == "close_requested"
            await sideband.wait_for("session.closed", timeout=10)
            await asyncio.sleep(0.5)
            assert caller.closed and sideband.closed  # both connections end with the session


async def test_what_names_no_running_session_or_is_not_served_is_refused_by_name(gateway: GatewayProcess) -> None:
    async with websockets.connect(f"{gateway.ws_url}/v1/live/sessions/sess_nope/attach") as ws:
        error = json.loads(await ws.recv())
        assert_valid_live_event(error)
        assert error["error"]["code"] == "session_not_found"
        with pytest.raises(websockets.ConnectionClosed):
            await asyncio.wait_for(ws.recv(), 5)
    async with httpx.AsyncClient(base_url=gateway.url) as http:
        missing = await http.post("/v1/live/sessions/sess_nope/hangup")
        assert missing.status_code == 404 and missing.json()["error"]["code"] == "session_not_found"
        for operation, body in (("accept", {"session": {"model": "gpt-live-1", "type": "live"}}),
                                ("reject", {"status_code": 486}), ("refer", {"target_uri": "tel:+14155550123"})):
            refused = await http.post(f"/v1/live/sessions/sess_1/{operation}", json=body)  # no --sip-listen here
            assert refused.status_code == 404, (operation, refused.text)
            assert refused.json()["error"]["code"] == "sip_not_enabled", refused.text
        forked = await http.post("/v1/live/sessions/sess_1/fork", json={})
        assert forked.status_code == 400 and forked.json()["error"]["code"] == "unsupported_operation", forked.text
        for session, code, param in (
                ({"model": "gpt-live-1", "audio": {"format": {"type": "audio/pcm"}}}, "unsupported_value",
                 "session.audio.format"),
                ({"model": "gpt-live-1", "client": {"data_channel": {"allowed_client_events": ["session.nope"]}}},
                 "invalid_value", "session.client.data_channel"),
                ({"model": "gpt-nope"}, "model_not_found", "session.model")):
            bad = await http.post("/v1/live/sessions", json={"session": session,
                                                             "transport": {"type": "webrtc", "sdp": "v=0"}})
            assert (bad.json()["error"]["code"], bad.json()["error"]["param"]) == (code, param), bad.text
        garbage = await http.post("/v1/live/sessions", json={"session": {"model": "gpt-live-1"},
                                                             "transport": {"type": "webrtc", "sdp": "hello"}})
        assert garbage.status_code == 400 and garbage.json()["error"]["param"] == "transport.sdp"
        assert (await http.get("/healthz")).status_code == 200  # still serving
