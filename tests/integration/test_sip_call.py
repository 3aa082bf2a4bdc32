"""Phone calls over SIP (--sip-listen), with SIPp (Debian's sip-tester) dialling in on loopback. The application
gets `realtime.call.incoming`, checks its signature with the openai SDK and answers with the SDK's
`client.realtime.calls` (accept, refer, hangup); it watches the call over `/v1/realtime?call_id=`. The caller's voice
is espeak-ng's, not the gateway's own Piper voice."""

from __future__ import annotations

import asyncio
import re
import socket
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import numpy as np
import openai
import pytest
import pytest_asyncio

from benchmarks.voices import EspeakSpeaker, espeak_available
from inference.asr import AsrEngine
from media.frames import AudioChunk
from media.resample import resample
from tests.conftest import QUESTION
from tests.gateway_process import GatewayProcess, start_gateway
from tests.integration.live_client import LiveCaller
from tests.integration.realtime_client import RealtimeClient
from tests.integration.sip_peers import (
    RATE,
    SIP_PASSWORD,
    SIP_USER,
    WEBHOOK_SECRET,
    Baresip,
    RtpRecorder,
    WebhookApplication,
    baresip_available,
    event_json,
    free_port,
    free_sip_port,
    scenario,
    self_signed_certificate,
    sipp_available,
    start_sipp,
    write_mulaw,
)
from tests.integration.speech import HEARD_AS_SAID, heard_within, transcribe, with_silence
from tests.integration.webrtc_peer import loud

pytestmark = pytest.mark.skipif(not (sipp_available() and espeak_available()),
                                reason="sipp (sip-tester) or espeak-ng is not installed (.ci/run installs them)")

ANSWER_TIMEOUT_S = 8  # short, so that the undelivered webhook's call is turned away within the test


@pytest.fixture(scope="module")
def application() -> Iterator[WebhookApplication]:
    app = WebhookApplication()
    yield app
    app.close()


@pytest.fixture(scope="module")
def sip_gateway(tmp_path_factory: pytest.TempPathFactory, application: WebhookApplication) -> Iterator[tuple[GatewayProcess, int]]:
    sip_port = free_sip_port()
    rtp_low = free_port(even=True)
    certificate, key = self_signed_certificate(tmp_path_factory.mktemp("sip-tls"))
    process = start_gateway(
        "--sip-listen", f"127.0.0.1:{sip_port}", "--webhook-url", application.url, "--webhook-secret", WEBHOOK_SECRET,
        "--sip-tls-cert", str(certificate), "--sip-tls-key", str(key),
        "--sip-answer-timeout-s", str(ANSWER_TIMEOUT_S), "--sip-rtp-ports", f"{rtp_low}-{rtp_low + 200}",
        "--sip-invites-per-minute", "30", "--sip-auth", f"{SIP_USER}:{SIP_PASSWORD}",
        log_path=tmp_path_factory.mktemp("sip-gateway") / "gateway.log")
    yield process, sip_port
    process.stop()


@pytest_asyncio.fixture
async def sdk(sip_gateway: tuple[GatewayProcess, int]) -> AsyncIterator[openai.AsyncOpenAI]:
    client = openai.AsyncOpenAI(base_url=sip_gateway[0].url + "/v1", api_key="sk-local", max_retries=0)
    yield client
    await client.close()


async def watch(gateway: GatewayProcess, call_id: str) -> RealtimeClient:
    watcher = await RealtimeClient.connect(f"{gateway.url.replace('http', 'ws', 1)}/v1/realtime?call_id={call_id}")
    await watcher.send({"type": "session.update", "session": {"type": "realtime"}})
    answer = await watcher.recv()
    assert answer["type"] == "session.updated", answer
    return watcher


async def incoming(application: WebhookApplication) -> dict[str, object]:
    event = event_json(await application.next_event(timeout=30))
    assert event["type"] == "realtime.call.incoming", event
    return event


def bare_invite(local_port: int, sip_port: int) -> bytes:
    """An INVITE with a PCMU offer, written by hand."""
    sdp = ("v=0\r\no=caller 1 1 IN IP4 127.0.0.1\r\ns=-\r\nc=IN IP4 127.0.0.1\r\nt=0 0\r\n"
           "m=audio 40000 RTP/AVP 0\r\na=rtpmap:0 PCMU/8000\r\n")
    return (f"INVITE sip:assistant@127.0.0.1:{sip_port} SIP/2.0\r\n"
            f"Via: SIP/2.0/UDP 127.0.0.1:{local_port};branch=z9hG4bK-raw-{time.monotonic_ns()}\r\n"
            f"From: <sip:caller@127.0.0.1:{local_port}>;tag=raw\r\nTo: <sip:assistant@127.0.0.1:{sip_port}>\r\n"
            f"Call-ID: raw-{time.monotonic_ns()}@127.0.0.1\r\nCSeq: 1 INVITE\r\n"
            f"Contact: <sip:caller@127.0.0.1:{local_port}>\r\nMax-Forwards: 70\r\n"
            f"Content-Type: application/sdp\r\nContent-Length: {len(sdp)}\r\n\r\n{sdp}").encode()


async def hang_up_on(sipp: asyncio.subprocess.Process) -> None:
    """SIPp killed if a failed test left it waiting."""
    if sipp.returncode is None:
        sipp.kill()
        await sipp.wait()


async def finished(sipp: asyncio.subprocess.Process, timeout: float) -> tuple[int, str]:
    output, _ = await asyncio.wait_for(sipp.communicate(), timeout)
    return sipp.returncode or 0, output.decode(errors="replace")[-3000:]


async def test_a_sip_call_is_answered_through_the_webhook_takes_digits_is_transferred_and_hung_up(
        sip_gateway: tuple[GatewayProcess, int], application: WebhookApplication, sdk: openai.AsyncOpenAI,
        asr: AsrEngine, tmp_path: Path) -> None:
    gateway, sip_port = sip_gateway
    question = EspeakSpeaker("en-us", 160).say(QUESTION, RATE).pcm
    question_file = write_mulaw(tmp_path / "question.ulaw", with_silence(question, RATE, 0.3, 2.0))
    ear_port = free_port(even=True)
    ear = await RtpRecorder.listen(ear_port)
    question_ms = int(1000 * (question.size / RATE + 2.3)) + 2000
    sipp = await start_sipp(scenario("call.xml", tmp_path, QUESTION=str(question_file), QUESTION_MS=str(question_ms),
                                     LISTEN=str(ear_port)), sip_port)
    try:
        event = await incoming(application)
        data = event["data"]
        assert isinstance(data, dict) and data["sip_media_security"] == "rtp"
        headers = {header["name"].lower(): header["value"] for header in data["sip_headers"]}
        assert headers["x-customer-id"] == "4242", headers  # the INVITE's own headers, for the application
        assert "authorization" not in headers, headers  # its digest answer is not the application's to see
        call_id = str(data["call_id"])
        await sdk.realtime.calls.accept(call_id, type="realtime", instructions="Answer in one short sentence.",
                                        max_output_tokens=40, extra_body={"temperature": 0})
        with pytest.raises(openai.ConflictError):  # answered once
            await sdk.realtime.calls.accept(call_id, type="realtime")
        watcher = await watch(gateway, call_id)
        final = await watcher.wait_for("conversation.item.input_audio_transcription.completed", timeout=90)
        assert final["transcript"].strip(), final
        done = await watcher.wait_for("response.done", timeout=120)
        assert done["response"]["status"] in ("completed", "incomplete"), done
        transcript = done["response"]["output"][0]["content"][0]["transcript"]
        await watcher.wait_for("output_audio_buffer.stopped", timeout=60)
        await asyncio.sleep(0.3)  # the last packets' way over loopback
        answer = ear.audio_between(0.0, time.monotonic())
        assert loud(answer), "no reply audio reached the caller's RTP port"
        heard = await transcribe(asr, AudioChunk(resample(answer, RATE, 16000), 16000))
        assert heard_within(heard, transcript) >= HEARD_AS_SAID, (heard, transcript)  # over 8 kHz G.711 too
        # RTP as a phone expects it: one stream, 20 ms a packet, consecutive numbers.
        assert len(ear.sources) == 1
        steps = np.diff(np.array(ear.timestamps, dtype=np.int64)) % 2**32
        assert np.all(steps == 160), set(steps.tolist())
        assert np.all(np.diff(np.array(ear.sequence, dtype=np.int64)) % 2**16 == 1)

        deadline = time.monotonic() + 60  # the digits may have come while the answer played
        while len(digits := watcher.of_type("input_audio_buffer.dtmf_event_received")) < 3:
            await watcher.recv(max(0.01, deadline - time.monotonic()))
        assert [digit["event"] for digit in digits] == ["1", "2", "#"]

        await sdk.realtime.calls.refer(call_id, target_uri="tel:+14155550123")  # SIPp waits for it, answers 202
        await sdk.realtime.calls.hangup(call_id)  # BYE, which SIPp waits for too
        code, output = await finished(sipp, 60)
        assert code == 0, output  # every message of the scenario came, in order
        with pytest.raises(openai.NotFoundError):
            await sdk.realtime.calls.refer(call_id, target_uri="tel:+14155550123")
        await watcher.close()
    finally:
        await hang_up_on(sipp)
        ear.close()


async def test_speech_over_the_answer_cuts_it_on_the_rtp_stream_and_keeps_what_was_sent(
        sip_gateway: tuple[GatewayProcess, int], application: WebhookApplication, sdk: openai.AsyncOpenAI,
        tmp_path: Path) -> None:
    gateway, sip_port = sip_gateway
    interruption = EspeakSpeaker("en-gb", 160).say("Stop. Tell me about cats instead.", RATE).pcm
    speech = write_mulaw(tmp_path / "interruption.ulaw", with_silence(interruption, RATE, 0.0, 1.5))
    ear_port = free_port(even=True)
    ear = await RtpRecorder.listen(ear_port)
    sipp = await start_sipp(scenario("interrupt.xml", tmp_path, QUESTION=str(speech), LISTEN=str(ear_port)), sip_port)
    try:
        call_id = str((await incoming(application))["data"]["call_id"])  # type: ignore[index]
        await sdk.realtime.calls.accept(call_id, type="realtime", max_output_tokens=300, extra_body={"temperature": 0})
        watcher = await watch(gateway, call_id)
        await watcher.send({"type": "conversation.item.create", "item": {"type": "message", "role": "user", "content": [
            {"type": "input_text", "text": "Tell me a long story about a dragon who loves books."}]}})
        await watcher.send({"type": "response.create"})
        await watcher.wait_for("output_audio_buffer.started", timeout=90)
        await asyncio.sleep(1.5)
        await sdk.realtime.calls.refer(call_id, target_uri="sip:agent@127.0.0.1")  # SIPp's cue to speak
        onset = time.monotonic()
        await watcher.wait_for("output_audio_buffer.cleared", timeout=30)
        done = await watcher.wait_for("response.done", timeout=30)
        await asyncio.sleep(0.5)
        loud_times = [at for at, pcm in ear.heard if loud(pcm)]
        assert loud_times and loud_times[-1] - onset < 2.5, loud_times[-1] - onset  # not the story's end
        if done["response"]["status"] == "cancelled":
            generated = "".join(event["delta"] for event in watcher.of_type("response.output_audio_transcript.delta"))
            kept = done["response"]["output"][0]["content"][0]["transcript"]
            assert 0 < len(kept) < len(generated), (kept, generated)
        else:  # generated before the cut: the item is truncated to the audio sent
            truncated = await watcher.wait_for("conversation.item.truncated", timeout=10)
            assert 0 < truncated["audio_end_ms"] <= 20 * len(ear.heard), truncated
        await sdk.realtime.calls.hangup(call_id)
        code, output = await finished(sipp, 60)
        assert code == 0, output
        await watcher.close()
    finally:
        await hang_up_on(sipp)
        ear.close()


async def test_a_reinvite_moves_the_media_holds_it_and_a_codec_change_is_refused(
        sip_gateway: tuple[GatewayProcess, int], application: WebhookApplication, sdk: openai.AsyncOpenAI,
        tmp_path: Path) -> None:
    gateway, sip_port = sip_gateway
    first_port, moved_port = free_port(even=True), free_port(even=True)
    first, moved = await RtpRecorder.listen(first_port), await RtpRecorder.listen(moved_port)
    sipp = await start_sipp(scenario("reinvite.xml", tmp_path, LISTEN=str(first_port), MOVED=str(moved_port)), sip_port)
    try:
        call_id = str((await incoming(application))["data"]["call_id"])  # type: ignore[index]
        await sdk.realtime.calls.accept(call_id, type="realtime")
        code, output = await finished(sipp, 60)  # 200, 200, 488, then its BYE answered
        ended = time.monotonic()
        assert code == 0, output
        first_times = [at for at, _ in first.heard]
        moved_times = [at for at, _ in moved.heard]
        assert first_times and moved_times, (len(first_times), len(moved_times))
        assert first_times[-1] < moved_times[0] + 0.1, "RTP still went to the old address after the move"
        assert len(moved_times) >= 20, len(moved_times)  # 1.5 s between the move and the hold: ~75 packets
        # On hold from the second re-INVITE on: nothing was sent in the call's last 2 s, the refused re-INVITE
        # (PCMA) changing nothing.
        assert ended - moved_times[-1] > 1.2, ended - moved_times[-1]
        # One stream throughout: its sequence numbers go on from the first address to the second.
        steps = np.diff(np.array(first.sequence[-1:] + moved.sequence, dtype=np.int64)) % 2**16
        assert np.all((steps >= 1) & (steps < 100)), steps
    finally:
        await hang_up_on(sipp)
        first.close()
        moved.close()


@pytest.mark.skipif(not baresip_available(), reason="baresip is not installed (.ci/run installs it)")
async def test_a_softphone_on_tls_and_srtp_is_heard_and_hears_the_answer(
        sip_gateway: tuple[GatewayProcess, int], application: WebhookApplication, sdk: openai.AsyncOpenAI,
        asr: AsrEngine, tmp_path: Path) -> None:
    """baresip dials over TLS with SDES keys (RTP/SAVP, its mediaenc srtp-mand), as GPT-Live's SIP calls come, and
    answers the digest challenge; its TLS and SRTP are libre's own, so both directions decrypting proves the keys and
    the profile, not our library against itself."""
    gateway, sip_port = sip_gateway
    question = EspeakSpeaker("en-us+f3", 150).say(QUESTION, RATE).pcm
    phone = await Baresip.dial(tmp_path / "baresip", sip_port + 1, with_silence(question, RATE, 0.5, 30.0),
                               transport="tls")
    try:
        event = await incoming(application)
        data = event["data"]
        assert isinstance(data, dict) and data["sip_media_security"] == "srtp", data
        call_id = str(data["call_id"])
        await sdk.realtime.calls.accept(call_id, type="realtime", instructions="Answer in one short sentence.",
                                        max_output_tokens=40, extra_body={"temperature": 0})
        await phone.wait_for("SRTP is Enabled", 30)  # answered with RTP/SAVP and our key
        watcher = await watch(gateway, call_id)
        final = await watcher.wait_for("conversation.item.input_audio_transcription.completed", timeout=90)
        assert final["transcript"].strip(), final  # the caller's SRTP, decrypted, was speech
        done = await watcher.wait_for("response.done", timeout=120)
        transcript = done["response"]["output"][0]["content"][0]["transcript"]
        await watcher.wait_for("output_audio_buffer.stopped", timeout=60)
        await asyncio.sleep(0.5)
        await sdk.realtime.calls.hangup(call_id)
        await phone.wait_for("terminated", 30)  # our BYE ended its call
        await phone.stop()
        answer = phone.heard()
        assert loud(answer), "the softphone heard nothing: our SRTP did not decrypt on its side"
        heard = await transcribe(asr, AudioChunk(resample(answer, RATE, 16000), 16000))
        assert heard_within(heard, transcript) >= HEARD_AS_SAID, (heard, transcript)
        await watcher.close()
    finally:
        await phone.stop()


@pytest.mark.skipif(not baresip_available(), reason="baresip is not installed (.ci/run installs it)")
async def test_a_gpt_live_session_answers_a_softphone_takes_and_sends_digits_and_hangs_up(
        sip_gateway: tuple[GatewayProcess, int], application: WebhookApplication, sdk: openai.AsyncOpenAI,
        asr: AsrEngine, tmp_path: Path) -> None:
    """An SRTP call is announced on both surfaces; the application answers it as GPT-Live
    (`client.live.sessions.accept`), which makes the Realtime id unknown. The sideband (the SDK's) hears the caller
    and the reply, gets the caller's keypad digits as transport.dtmf.received and sends one with transport.dtmf.send,
    which baresip's own RFC 4733 decoder reports; refer and hangup are the Live session's."""
    gateway, sip_port = sip_gateway
    application.forget()
    question = EspeakSpeaker("en-gb", 150).say(QUESTION, RATE).pcm
    phone = await Baresip.dial(tmp_path / "baresip", sip_port + 1, with_silence(question, RATE, 0.5, 40.0),
                               transport="tls")
    try:
        live = event_json(await application.next_event("live.transport.incoming", 30))
        data = live["data"]
        assert isinstance(data, dict) and data["type"] == "sip" and data["sip_media_security"] == "srtp", data
        assert "authorization" not in {header["name"].lower() for header in data["sip_headers"]}
        session_id = str(data["session_id"])
        realtime = event_json(await application.next_event("realtime.call.incoming", 30))
        call_id = str(realtime["data"]["call_id"])  # type: ignore[index]
        with pytest.raises(openai.BadRequestError):  # SIP negotiated the format: the session may not name one
            await sdk.live.sessions.accept(session_id, session={
                "type": "live", "model": "gpt-live-1", "audio": {"format": {"type": "audio/pcmu"}}})  # type: ignore[typeddict-unknown-key]
        with pytest.raises(openai.BadRequestError):  # Live's reject names its code
            await sdk.post(f"/live/sessions/{session_id}/reject", body={}, cast_to=httpx.Response)
        await sdk.live.sessions.accept(session_id, session={
            "type": "live", "model": "gpt-live-1", "instructions": "Answer in one short sentence."})
        with pytest.raises(openai.NotFoundError):  # the first accept chose the surface
            await sdk.realtime.calls.accept(call_id, type="realtime")
        with pytest.raises(openai.ConflictError):
            await sdk.live.sessions.accept(session_id, session={"type": "live", "model": "gpt-live-1"})
        await phone.wait_for("SRTP is Enabled", 30)
        async with LiveCaller.attach(gateway.url, session_id, api_key="sk-local") as sideband:
            heard = await sideband.wait_for("session.input_transcript.delta", timeout=90)
            assert heard["delta"].strip(), heard  # the caller's SRTP, decrypted, was speech
            await sideband.wait_for("session.output_transcript.delta", timeout=120)
            phone.press("12#")
            digits = [(await sideband.wait_for("transport.dtmf.received", count=n, timeout=30))["event"]
                      for n in (1, 2, 3)]
            assert digits == ["1", "2", "#"]
            await sideband.send({"type": "transport.dtmf.send", "event": "7", "event_id": "evt_key"})
            sent = await sideband.wait_for("transport.dtmf.sent", timeout=10)
            assert sent["event"] == "7" and sent["client_event_id"] == "evt_key", sent
            await phone.wait_for("received event: '7'", 30)  # baresip decoded our telephone-event
            await sideband.send({"type": "transport.dtmf.send", "event": "x", "event_id": "evt_bad"})
            refused = await sideband.wait_for("error", where=lambda event: event.get("client_event_id") == "evt_bad")
            assert refused["error"]["param"] == "event", refused
            await sdk.live.sessions.refer(session_id, target_uri="tel:+14155550123")
            await phone.wait_for("transferring call", 30)  # the REFER reached the phone, which acts on it
            await sideband.wait_for("session.usage.updated", timeout=120)  # the reply is made: now let it play out
            while time.monotonic() - sideband.of_type("session.output_transcript.delta")[-1]["_at"] < 1.5:
                await asyncio.sleep(0.2)
            await sdk.live.sessions.hangup(session_id)
            await sideband.wait_for("session.closed", timeout=30)
            await phone.wait_for("terminated", 30)  # our BYE ended its call
        await phone.stop()
        answer = phone.heard()
        assert loud(answer), "the softphone heard nothing"
        said = sideband.said()
        heard_answer = await transcribe(asr, AudioChunk(resample(answer, RATE, 16000), 16000))
        assert heard_within(heard_answer, said) >= HEARD_AS_SAID, (heard_answer, said)
        with pytest.raises(openai.NotFoundError):
            await sdk.live.sessions.refer(session_id, target_uri="tel:+14155550123")
        # A second call, which the caller ends: the sideband is told why.
        phone = await Baresip.dial(tmp_path / "baresip-2", sip_port + 1, with_silence(question, RATE, 0.5, 40.0),
                                   transport="tls")
        session_id = str(event_json(await application.next_event("live.transport.incoming", 30))["data"]["session_id"])  # type: ignore[index]
        await sdk.live.sessions.accept(session_id, session={"type": "live", "model": "gpt-live-1"})
        await phone.wait_for("SRTP is Enabled", 30)
        async with LiveCaller.attach(gateway.url, session_id, api_key="sk-local") as sideband:
            await sideband.wait_for("session.input_audio.append", timeout=30)
            phone.command("/hangup")
            closed = await sideband.wait_for("session.closed", timeout=30)
            assert closed["reason"] == "remote_hangup", closed
    finally:
        await phone.stop()


async def test_bad_calls_are_refused_and_the_trunk_goes_on(sip_gateway: tuple[GatewayProcess, int],
                                                          application: WebhookApplication, sdk: openai.AsyncOpenAI,
                                                          tmp_path: Path) -> None:
    gateway, sip_port = sip_gateway
    application.forget()  # the other surface's announcements of earlier SRTP calls
    # No codec in common (G.722 only): 488, and the application is never told.
    sipp = await start_sipp(scenario("refused.xml", tmp_path, CODEC_PT="9", CODEC="9 G722/8000", STATUS="488"), sip_port)
    code, output = await finished(sipp, 60)
    assert code == 0, output
    # A datagram that is not SIP, and an INVITE missing its headers: no answer, no crash.
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as raw:
        raw.sendto(b"\x00\xffnot sip at all\r\n\r\n", ("127.0.0.1", sip_port))
        raw.sendto(b"INVITE sip:x@127.0.0.1 SIP/2.0\r\nContent-Length: 0\r\n\r\n", ("127.0.0.1", sip_port))
    # The application rejects the call with its own code, through the SDK.
    sipp = await start_sipp(scenario("refused.xml", tmp_path, CODEC_PT="0", CODEC="0 PCMU/8000", STATUS="486"), sip_port)
    call_id = str((await incoming(application))["data"]["call_id"])  # type: ignore[index]
    await sdk.realtime.calls.reject(call_id, status_code=486)
    code, output = await finished(sipp, 60)
    assert code == 0, output
    with pytest.raises(openai.NotFoundError):
        await sdk.realtime.calls.accept(call_id, type="realtime")
    # The application is down: the webhook is retried, then the call is turned away (480) at the answer timeout.
    application.answer_status = 503
    tries = application.tries
    try:
        sipp = await start_sipp(scenario("refused.xml", tmp_path, CODEC_PT="0", CODEC="0 PCMU/8000", STATUS="480"), sip_port)
        code, output = await finished(sipp, ANSWER_TIMEOUT_S + 60)
        assert code == 0, output
        assert application.tries - tries >= 3, "the webhook was not retried"
    finally:
        application.answer_status = 200
    assert application.bad_signatures == 0
    async with httpx.AsyncClient(base_url=gateway.url, timeout=10) as http:
        health = (await http.get("/healthz")).json()
    assert health["sip"]["ringing"] == 0 and health["sip"]["answered"] == 0, health["sip"]  # nothing left behind
    assert health["sip"]["auth"] == "digest" and health["sip"]["transports"] == ["udp", "tcp", "tls"], health["sip"]
    assert health["vad"] == {"wideband": "silero_vad_v6.onnx", "narrowband": "silero_vad_16k_op15.onnx"}  # calls' own
    # A wrong digest password (SIPp answers the challenge itself), and an INVITE with none at all: 403 and 401,
    # and the application is never told.
    sipp = await start_sipp(scenario("refused.xml", tmp_path, password="not-the-password", CODEC_PT="0",
                                     CODEC="0 PCMU/8000", STATUS="403"), sip_port)
    code, output = await finished(sipp, 60)
    assert code == 0, output
    sipp = await start_sipp(scenario("refused.xml", tmp_path, password=None, CODEC_PT="0", CODEC="0 PCMU/8000",
                                     STATUS="401"), sip_port)
    code, output = await finished(sipp, 60)
    assert code == 0, output
    assert all(events.empty() for events in application.events.values())
    # A flood from one source: past --sip-invites-per-minute the INVITEs get 503, and the trunk still answers.
    flood = await start_sipp(scenario("refused.xml", tmp_path, CODEC_PT="9", CODEC="9 G722/8000", STATUS="488"), sip_port,
                             extra=("-m", "40", "-r", "40", "-l", "40", "-trace_stat"))
    await finished(flood, 120)  # SIPp counts the 503s as failed calls: its exit code says nothing here
    async with httpx.AsyncClient(base_url=gateway.url, timeout=10) as http:
        metrics = (await http.get("/metrics")).text
    assert 'gateway_sip_invites_total{outcome="503"}' in metrics, "the flood was not limited"
    assert 'gateway_sip_invites_total{outcome="488"}' in metrics
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as raw:  # still limited, and told for how long
        raw.settimeout(10)
        raw.bind(("127.0.0.1", 0))
        raw.sendto(bare_invite(raw.getsockname()[1], sip_port), ("127.0.0.1", sip_port))
        limited = raw.recv(4096).decode()
        while limited.startswith("SIP/2.0 100"):
            limited = raw.recv(4096).decode()
    assert limited.startswith("SIP/2.0 503"), limited
    retry_after = re.search(r"(?im)^Retry-After:\s*(\d+)", limited)
    assert retry_after is not None and 1 <= int(retry_after.group(1)) <= 60, limited
    sipp = await start_sipp(scenario("options.xml", tmp_path), sip_port)
    code, output = await finished(sipp, 30)
    assert code == 0, output
