"""Phone calls through carriers' media streams (/v1/telephony/twilio, /telnyx, /plivo), with a caller written from
each carrier's published messages (gateway/bench/carriers.py's CarrierLine, the bench's too) and the application
watching over the sideband (`/v1/realtime?call_id=<the carrier's call id>`). The caller's voice is espeak-ng's, not
the gateway's own Piper voice."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import numpy as np
import pytest
import websockets

from benchmarks.voices import EspeakSpeaker, espeak_available
from gateway.bench.carriers import CarrierLine
from gateway.bench.phone import RATE
from inference.asr import AsrEngine
from media.frames import AudioChunk
from media.resample import resample
from tests.conftest import QUESTION
from tests.gateway_process import GatewayProcess
from tests.integration.realtime_client import RealtimeClient
from tests.integration.speech import HEARD_AS_SAID, heard_within, transcribe, with_silence, words
from tests.integration.webrtc_peer import loud

pytestmark = pytest.mark.skipif(not espeak_available(), reason="espeak-ng is not installed (.ci/run installs it)")


async def watch(gateway: GatewayProcess, call_sid: str, timeout: float = 30.0) -> RealtimeClient:
    """The application's sideband on the call, by the carrier's call id, once the stream's session is open."""
    deadline = time.monotonic() + timeout
    while True:
        watcher = await RealtimeClient.connect(f"{gateway.url.replace('http', 'ws', 1)}/v1/realtime?call_id={call_sid}")
        try:
            await watcher.send({"type": "session.update", "session": {"type": "realtime"}})
            answer = await watcher.recv()
        except websockets.ConnectionClosed as closed:  # refused and closed before our update went out: the close says why
            answer = {"type": "error", "error": {"code": closed.rcvd.reason if closed.rcvd else None}}
        if answer["type"] == "session.updated":
            return watcher
        assert answer["type"] == "error" and answer["error"]["code"] == "call_not_found", answer
        await watcher.close()
        assert time.monotonic() < deadline, "the stream's session never opened"
        await asyncio.sleep(0.1)


@pytest.mark.parametrize(("carrier", "media_format"), [
    ("twilio", None), ("telnyx", {"encoding": "PCMA", "sample_rate": RATE, "channels": 1}), ("plivo", None)],
    ids=["twilio", "telnyx-pcma", "plivo"])
async def test_a_phone_call_is_answered_takes_digits_and_is_hung_up(
        gateway: GatewayProcess, asr: AsrEngine, carrier: str, media_format: dict[str, object] | None) -> None:
    question = EspeakSpeaker("en-us", 160).say(QUESTION, RATE).pcm
    session = {"temperature": 0, "max_output_tokens": 40, "instructions": "Answer briefly. Say nothing of marmalade."}
    caller = await CarrierLine.dial(carrier, gateway.url, {"session": json.dumps(session)}, media_format=media_format)
    try:
        watcher = await watch(gateway, caller.call_id)
        caller.say(with_silence(question, RATE, 0.3, 0.0))
        final = await watcher.wait_for("conversation.item.input_audio_transcription.completed", timeout=60)
        assert words(final["transcript"]), final
        done = await watcher.wait_for("response.done", timeout=90)
        assert done["response"]["status"] in ("completed", "incomplete"), done
        transcript = done["response"]["output"][0]["content"][0]["transcript"]
        # Played out: said when the carrier echoes the mark after the reply's last audio.
        await watcher.wait_for("output_audio_buffer.stopped", timeout=60)
        answer = np.concatenate([pcm for _, pcm in caller.heard])
        assert loud(answer)
        heard = await transcribe(asr, AudioChunk(resample(answer, RATE, 16000), 16000))
        assert heard_within(heard, transcript) >= HEARD_AS_SAID, (heard, transcript)  # over 8 kHz G.711 too
        assert caller.of_kind("mark"), "no marks: the server cannot know what the caller heard"

        for digit in "12#":
            await caller.press(digit)
        digits = [await watcher.wait_for("input_audio_buffer.dtmf_event_received", timeout=10) for _ in range(3)]
        assert [event["event"] for event in digits] == ["1", "2", "#"]
        assert all(abs(event["received_at"] - time.time()) < 60 for event in digits)
        await caller.press("X")
        assert (await watcher.wait_for("error", timeout=10))["error"]["code"] == "invalid_value"

        async with httpx.AsyncClient(base_url=gateway.url, timeout=10) as http:
            hung_up = await http.post(f"/v1/realtime/calls/{caller.call_id}/hangup")
        assert hung_up.status_code == 200, hung_up.text
        await caller.wait_closed(10)
        assert caller.close_code == 1000
        await watcher.close()
        # Telnyx's and Plivo's settings came in the stream URL, which uvicorn logs: the instructions are user text.
        assert "marmalade" not in gateway.log_path.read_text()
    finally:
        await caller.close()


@pytest.mark.parametrize("carrier", ["twilio", "plivo"])  # Plivo never reaches the checkpoints a clear drops
async def test_speech_over_the_answer_clears_the_carrier_and_keeps_what_was_heard(gateway: GatewayProcess,
                                                                                  carrier: str) -> None:
    interruption = EspeakSpeaker("en-gb", 160).say("Stop. Tell me about cats instead.", RATE).pcm
    caller = await CarrierLine.dial(carrier, gateway.url, {"session": json.dumps({"temperature": 0, "max_output_tokens": 300})})
    try:
        watcher = await watch(gateway, caller.call_id)
        await watcher.send({"type": "conversation.item.create", "item": {"type": "message", "role": "user", "content": [
            {"type": "input_text", "text": "Tell me a long story about a dragon who loves books."}]}})
        await watcher.send({"type": "response.create"})
        await watcher.wait_for("output_audio_buffer.started", timeout=60)
        await asyncio.sleep(1.5)
        onset = time.perf_counter()
        caller.say(interruption)
        await watcher.wait_for("output_audio_buffer.cleared", timeout=30)
        assert caller.of_kind("clear"), "the carrier was not told to drop the audio it holds"
        done = await watcher.wait_for("response.done", timeout=30)
        await asyncio.sleep(0.5)
        loud_times = [at for at, pcm in caller.heard if loud(pcm)]
        assert loud_times and loud_times[-1] - onset < 2.5, loud_times[-1] - onset  # not the story's end
        if done["response"]["status"] == "cancelled":
            generated = "".join(event["delta"] for event in watcher.of_type("response.output_audio_transcript.delta"))
            kept = done["response"]["output"][0]["content"][0]["transcript"]
            assert 0 < len(kept) < len(generated), (kept, generated)
        else:  # generated before the cut: the item is truncated to what the caller heard
            truncated = await watcher.wait_for("conversation.item.truncated", timeout=10)
            played_ms = 20 * len(caller.heard)
            assert 0 < truncated["audio_end_ms"] <= played_ms, (truncated, played_ms)
        await watcher.close()
    finally:
        await caller.hang_up()
        await caller.close()


async def test_a_stream_the_carrier_did_not_send_is_closed_with_its_reason(gateway: GatewayProcess) -> None:
    unknown = await CarrierLine.dial("twilio", gateway.url, {"caller_name": "x"})
    await unknown.wait_closed(10)
    assert (unknown.close_code, "caller_name" in unknown.close_reason) == (1008, True), unknown.close_reason
    await unknown.close()
    unknown = await CarrierLine.dial("plivo", gateway.url, {"caller_name": "x"})  # in the query string
    await unknown.wait_closed(10)
    assert (unknown.close_code, "caller_name" in unknown.close_reason) == (1008, True), unknown.close_reason
    await unknown.close()

    for carrier, media_format, named in (
            ("twilio", {"encoding": "audio/x-l16", "sampleRate": 16000, "channels": 1}, "audio/x-mulaw"),
            ("telnyx", {"encoding": "OPUS", "sample_rate": 16000, "channels": 1}, "PCMU or PCMA"),
            ("plivo", {"encoding": "audio/x-l16", "sampleRate": 16000}, "audio/x-mulaw")):
        wideband = await CarrierLine.dial(carrier, gateway.url, {}, media_format=media_format)
        await wideband.wait_closed(10)
        assert wideband.close_code == 1008 and named in wideband.close_reason, (carrier, wideband.close_reason)
        await wideband.close()

    session = await CarrierLine.dial("telnyx", gateway.url, {"session": "{not json"})
    await session.wait_closed(10)
    assert session.close_code == 1008 and "invalid_json" in session.close_reason, session.close_reason
    await session.close()

    url = gateway.url.replace("http", "ws", 1) + "/v1/telephony/twilio"
    async with websockets.connect(url) as early:
        await early.send(json.dumps({"event": "media", "streamSid": "MZ1", "media": {"payload": ""}}))
        with pytest.raises(websockets.ConnectionClosed) as closed:
            await asyncio.wait_for(early.recv(), 10)
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 1008

    for carrier in ("twilio", "telnyx", "plivo"):
        malformed = await CarrierLine.dial(carrier, gateway.url, {})
        await malformed.connection.send("not json")
        await malformed.wait_closed(10)
        assert malformed.close_code == 1007, (carrier, malformed.close_code, malformed.close_reason)
        await malformed.close()
    # The gateway took every one of them in its stride.
    async with httpx.AsyncClient(base_url=gateway.url, timeout=10) as http:
        assert (await http.get("/healthz")).status_code == 200
