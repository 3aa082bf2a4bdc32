"""GPT-Live over its WebSocket (`client.live.connect()`, the official SDK): a spoken turn, full duplex (a backchannel
does not stop the reply, an interruption does), mute, appended context, close, and what is refused. Every server
event is checked against openai.types.live as it arrives (live_client.py)."""

from __future__ import annotations

import asyncio
import base64
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import websockets

from inference.asr import AsrEngine
from inference.tts import TtsEngine
from media.codecs import ulaw_decode, ulaw_encode
from media.frames import AudioChunk
from media.resample import resample
from tests.conftest import QUESTION
from tests.gateway_process import GatewayProcess, start_gateway
from tests.integration.live_client import RATE, LiveCaller
from tests.integration.sdk_types import assert_valid_live_event
from tests.integration.speech import HEARD_AS_SAID, heard_as, heard_within, transcribe, words

STORY = "a long story about a dragon who loves books"


@pytest.fixture(scope="module")
def live_gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    """Its own gateway: the tests read what its log says of their sessions' replies."""
    process = start_gateway(log_path=tmp_path_factory.mktemp("live") / "gateway.log")
    yield process
    process.stop()


def speech(tts: TtsEngine, text: str) -> np.ndarray:
    return resample(tts.synthesize_blocking(text), tts.sample_rate, RATE)


async def played_out(caller: LiveCaller, quiet_s: float = 1.5, timeout: float = 90.0) -> None:
    """Until the assistant's audio has stopped coming for `quiet_s`."""
    deadline = time.monotonic() + timeout
    await caller.wait_for("session.output_audio.delta", timeout=timeout)
    while time.monotonic() < deadline:
        last = caller.of_type("session.output_audio.delta")[-1]["_at"]
        if time.monotonic() - last >= quiet_s:
            return
        await asyncio.sleep(0.1)
    raise AssertionError("the assistant never stopped speaking")


def replies(gateway: GatewayProcess, session_id: str) -> list[dict[str, Any]]:
    """The gateway log's realtime.response.done events of one session (what the core did with each reply)."""
    found = []
    for line in Path(gateway.log_path).read_text().splitlines():
        if '"realtime.response.done"' in line and session_id in line:
            found.append(json.loads(line))
    return found


def on_timeline(events: list[dict[str, Any]]) -> None:
    for event in events:
        assert 0 <= event["start_ms"] <= event["end_ms"], event


async def test_a_spoken_question_gets_a_spoken_answer_whose_words_follow_its_audio(
    live_gateway: GatewayProcess, tts: TtsEngine, asr: AsrEngine, question_pcm: np.ndarray
) -> None:
    session = {"model": "gpt-live-1", "instructions": "Answer in one short sentence."}
    async with LiveCaller.connect(live_gateway.url, session) as caller:
        started = await caller.wait_for("session.started")
        resource = started["session"]
        assert resource["model"] == "gpt-live-1" and resource["status"] == "active"
        assert resource["audio"]["format"] == {"type": "audio/pcm", "rate": 24000}
        assert resource["instructions"] == session["instructions"]
        caller.say(resample(question_pcm, tts.sample_rate, RATE))
        await caller.wait_for("session.usage.updated", timeout=90)  # a reply was made
        await played_out(caller)

        assert heard_as(caller.heard(), QUESTION) >= HEARD_AS_SAID, caller.heard()
        heard = caller.of_type("session.input_transcript.delta")
        on_timeline(heard)
        said = caller.of_type("session.output_transcript.delta")
        on_timeline(said)
        assert words(caller.said())
        # The assistant's words are sent as the audio that carries them goes out: after what the user said.
        assert said[0]["start_ms"] >= heard[-1]["end_ms"]
        assert [e["start_ms"] for e in said] == sorted(e["start_ms"] for e in said)
        answer = caller.audio()
        assert len(answer) > RATE // 2
        spoken = await transcribe(asr, AudioChunk(answer, RATE))
        assert heard_within(spoken, caller.said()) >= HEARD_AS_SAID, (spoken, caller.said())
        usage = caller.of_type("session.usage.updated")[-1]["usage"]
        assert usage["seconds"] >= 1

        await caller.send({"type": "session.close", "event_id": "evt_bye"})
        closed = await caller.wait_for("session.closed")
        assert closed["reason"] == "close_requested" and closed["client_event_id"] == "evt_bye"
        assert closed["session"]["id"] == resource["id"] and closed["usage"]["seconds"] >= usage["seconds"]
        await asyncio.sleep(0.5)
        assert caller.closed  # the server closed the connection after session.closed
    assert [r["status"] for r in replies(live_gateway, resource["id"])] in (["completed"], ["incomplete"])


async def test_a_backchannel_does_not_stop_the_reply_and_an_interruption_does(
    live_gateway: GatewayProcess, tts: TtsEngine
) -> None:
    async with LiveCaller.connect(live_gateway.url, {"model": "gpt-live-1"}) as caller:
        session_id = (await caller.wait_for("session.started"))["session"]["id"]
        # Commentary is something the assistant may say: with nothing else under way, it says it at once.
        await caller.send({"type": "session.commentary.append", "content": f"Tell the user {STORY}.",
                           "delegation_id": None})
        await caller.wait_for("session.commentary.appended")
        await caller.wait_for("session.output_audio.delta", timeout=60)
        await asyncio.sleep(1.0)

        caller.clip_sent.clear()
        caller.say(speech(tts, "Yeah."))
        await caller.clip_sent.wait()
        await caller.wait_for("session.input_transcript.delta", timeout=30)
        heard_at = time.monotonic()
        await asyncio.sleep(2.0)
        assert len(caller.audio(since=heard_at)) >= RATE, "the reply plays on after the backchannel"
        assert [r["status"] for r in replies(live_gateway, session_id) if r["status"] == "cancelled"] == []

        caller.clip_sent.clear()
        caller.say(speech(tts, "Stop. What is the capital of France?"))
        await caller.clip_sent.wait()
        cut = await _wait_for_log(live_gateway, session_id, "cancelled")
        assert cut["status"] == "cancelled"
        # The interruption is a turn of its own, and it is answered.
        await caller.wait_for("session.usage.updated", count=2, timeout=90)
        answered_at = caller.of_type("session.usage.updated")[1]["_at"]
        await played_out(caller)
        assert len(caller.audio(since=answered_at - 5)) > 0


async def _wait_for_log(gateway: GatewayProcess, session_id: str, status: str, timeout: float = 30.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = [r for r in replies(gateway, session_id) if r["status"] == status]
        if found:
            return found[0]
        await asyncio.sleep(0.2)
    raise AssertionError(f"no reply {status} in the gateway's log: {replies(gateway, session_id)}")


async def test_muted_input_is_heard_as_silence_until_unmuted(live_gateway: GatewayProcess, tts: TtsEngine,
                                                            question_pcm: np.ndarray) -> None:
    async with LiveCaller.connect(live_gateway.url, {"model": "gpt-live-1.1"}) as caller:
        await caller.wait_for("session.started")
        await caller.send({"type": "session.input_audio.mute", "event_id": "evt_mute"})
        assert (await caller.wait_for("session.input_audio.muted"))["client_event_id"] == "evt_mute"
        caller.clip_sent.clear()
        caller.say(resample(question_pcm, tts.sample_rate, RATE))
        await caller.clip_sent.wait()
        await asyncio.sleep(2.0)
        assert not caller.of_type("session.input_transcript.delta") and not caller.of_type("session.output_audio.delta")
        await caller.send({"type": "session.input_audio.unmute"})
        await caller.wait_for("session.input_audio.unmuted")
        caller.say(resample(question_pcm, tts.sample_rate, RATE))
        await caller.wait_for("session.input_transcript.delta", timeout=30)
        await caller.wait_for("session.output_audio.delta", timeout=60)


async def test_context_appended_while_it_runs_is_acknowledged_on_the_timeline(live_gateway: GatewayProcess) -> None:
    async with LiveCaller.connect(live_gateway.url, {"model": "gpt-live-1", "input": [
            {"role": "user", "content": [{"type": "input_text", "text": "My name is Ann."}]},
            {"role": "assistant", "content": [{"type": "output_text", "text": "Hello Ann."}]}]}) as caller:
        await caller.wait_for("session.started")
        for kind in ("instructions", "thinking"):
            await caller.send({"type": f"session.{kind}.append", "content": "The user likes short answers.",
                               "delegation_id": None, "event_id": f"evt_{kind}"})
            acknowledged = await caller.wait_for(f"session.{kind}.appended")
            assert acknowledged["client_event_id"] == f"evt_{kind}"
            on_timeline([acknowledged])
        assert not caller.of_type("session.output_audio.delta")  # thinking is silent
        await caller.send({"type": "session.thinking.append", "content": "x", "delegation_id": "deleg_1",
                           "event_id": "evt_bad"})
        error = await caller.wait_for("error")
        assert error["error"]["code"] == "invalid_value" and error["error"]["param"] == "delegation_id"
        assert error["client_event_id"] == "evt_bad"
        await caller.send({"type": "session.update", "session": {}, "event_id": "evt_update"})
        updated = await caller.wait_for("session.updated")
        assert updated["client_event_id"] == "evt_update" and updated["session"]["model"] == "gpt-live-1"


@pytest.mark.parametrize(("event", "code", "param"), [
    ({"type": "decision.create"}, "unsupported_event", "type"),
    ({"type": "response.create"}, "unsupported_event", "type"),
    ({"type": "session.output_audio.fixture.play", "audio": ""}, "unsupported_event", "type"),
    ({"type": "session.update", "session": {"triggers": [{"type": "x"}]}}, "unsupported_value", "session.triggers"),
    ({"type": "session.update", "session": {"delegation": {"type": "client"}}}, "unsupported_value",
     "session.delegation"),
    ({"type": "session.start", "session": {"model": "gpt-live-1"}}, "session_already_started", "type"),
    ({"type": "session.input_audio.append", "audio": "not base64!"}, "invalid_audio", "audio"),
    ({"type": "session.commentary.append", "content": "x" * 5000}, "invalid_value", "content"),
    ({"type": "session.close", "reason": "x"}, "unknown_parameter", "reason"),
])
async def test_what_is_not_served_or_not_valid_is_refused_by_name(
    live_gateway: GatewayProcess, event: dict[str, Any], code: str, param: str
) -> None:
    async with LiveCaller.connect(live_gateway.url, {"model": "gpt-live-1"}, microphone=False) as caller:
        await caller.wait_for("session.started")
        await caller.send({**event, "event_id": "evt_refused"})
        error = await caller.wait_for("error")
        assert (error["error"]["code"], error["error"].get("param")) == (code, param), error
        assert error["client_event_id"] == error["error"]["client_event_id"] == "evt_refused"
        await caller.send({"type": "session.update", "session": {}})
        await caller.wait_for("session.updated")  # and the session goes on


@pytest.mark.parametrize(("session", "code"), [
    ({"model": "gpt-nope"}, "model_not_found"),
    ({"model": "gpt-live-1", "store": True}, "unsupported_value"),
    ({"model": "gpt-live-1", "audio": {"format": {"type": "audio/pcm", "rate": 44100}}}, "invalid_value"),
    ({"model": "gpt-live-1", "audio": {"output": {"voice": {"id": "voice_1"}}}}, "unsupported_value"),
    ({"model": "gpt-live-1", "voice": "marin"}, "unknown_parameter"),
])
async def test_a_session_start_that_cannot_be_served_is_refused_and_closed(
    live_gateway: GatewayProcess, session: dict[str, Any], code: str
) -> None:
    async with websockets.connect(f"{live_gateway.ws_url}/v1/live/sessions") as ws:
        await ws.send(json.dumps({"type": "session.input_audio.append", "audio": ""}))
        early = json.loads(await ws.recv())
        assert_valid_live_event(early)
        assert early["error"]["code"] == "session_not_started"
        await ws.send(json.dumps({"type": "session.start", "session": session}))
        error = json.loads(await ws.recv())
        assert_valid_live_event(error)
        assert error["type"] == "error" and error["error"]["code"] == code, error
        with pytest.raises(websockets.ConnectionClosed):
            await asyncio.wait_for(ws.recv(), 5)


@pytest.mark.parametrize(("fmt", "rate"), [("audio/pcm", 16000), ("audio/pcmu", 8000)])
async def test_the_audio_format_chosen_at_the_start_is_used_both_ways(
    live_gateway: GatewayProcess, tts: TtsEngine, asr: AsrEngine, question_pcm: np.ndarray, fmt: str, rate: int
) -> None:
    clip = resample(question_pcm, tts.sample_rate, rate)
    async with LiveCaller.connect(live_gateway.url, {"model": "gpt-live-1", "audio": {"format": {"type": fmt, "rate": rate}}},
                                  microphone=False) as caller:
        started = await caller.wait_for("session.started")
        assert started["session"]["audio"]["format"] == {"type": fmt, "rate": rate}
        step = rate // 50
        padded = np.concatenate([np.zeros(rate // 2, np.int16), clip, np.zeros(rate * 2, np.int16)])
        began = time.monotonic()
        for index, start in enumerate(range(0, len(padded), step)):
            chunk = padded[start:start + step]
            data = chunk.tobytes() if fmt == "audio/pcm" else ulaw_encode(chunk)
            await caller.send({"type": "session.input_audio.append", "audio": base64.b64encode(data).decode()})
            await asyncio.sleep(max(0.0, began + (index + 1) * 0.02 - time.monotonic()))
        await played_out(caller)
        raw = b"".join(base64.b64decode(e["delta"]) for e in caller.of_type("session.output_audio.delta"))
        answer = np.frombuffer(raw, np.int16) if fmt == "audio/pcm" else ulaw_decode(raw)
        spoken = await transcribe(asr, AudioChunk(answer, rate))
        assert heard_within(spoken, caller.said()) >= HEARD_AS_SAID, (spoken, caller.said())
