"""Speaking to the gateway over the Realtime WebSocket: VAD turns, transcripts, spoken answers, barge-in."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import time
from collections.abc import AsyncIterator

import httpx
import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from inference.asr import AsrEngine
from inference.tts import TtsEngine
from media.resample import resample
from tests.conftest import QUESTION
from tests.gateway_process import GatewayProcess
from tests.integration.conftest import MODEL
from tests.integration.realtime_client import RealtimeClient
from tests.integration.speech import (
    HEARD_AS_SAID,
    decode_deltas,
    encode_chunks,
    heard_as,
    heard_within,
    transcribe,
    with_silence,
    words,
)

FORMAT_RATES = {"audio/pcm": 24000, "audio/pcmu": 8000}


@pytest.fixture
async def client(gateway: GatewayProcess) -> AsyncIterator[RealtimeClient]:
    client = await RealtimeClient.opened(f"{gateway.ws_url}/v1/realtime")
    yield client
    await client.close()


async def stream_audio(client: RealtimeClient, payloads: list[str], chunk_s: float = 0.02) -> None:
    """Send 20 ms chunks paced like a live microphone."""
    started = time.monotonic()
    for index, payload in enumerate(payloads):
        await client.send({"type": "input_audio_buffer.append", "audio": payload})
        await asyncio.sleep(max(0.0, started + (index + 1) * chunk_s - time.monotonic()))


@pytest.mark.parametrize("fmt", ["audio/pcm", "audio/pcmu"])
async def test_spoken_question_gets_a_spoken_answer(
    client: RealtimeClient, fmt: str, tts: TtsEngine, asr: AsrEngine, question_pcm: np.ndarray
) -> None:
    rate = FORMAT_RATES[fmt]
    await client.send(
        {
            "type": "session.update",
            "session": {"temperature": 0, "audio": {"input": {"format": {"type": fmt}}, "output": {"format": {"type": fmt}}}},
        }
    )
    await client.wait_for("session.updated")
    speech = with_silence(resample(question_pcm, tts.sample_rate, rate), rate, 0.5, 1.5)
    sender = asyncio.create_task(stream_audio(client, encode_chunks(speech, rate, fmt)))
    done = await client.wait_for("response.done", timeout=90)
    await sender
    started = client.of_type("input_audio_buffer.speech_started")
    stopped = client.of_type("input_audio_buffer.speech_stopped")
    assert len(started) == 1 and len(stopped) == 1
    assert 300 <= started[0]["audio_start_ms"] <= 800
    final = client.of_type("conversation.item.input_audio_transcription.completed")
    assert heard_as(final[0]["transcript"], QUESTION) >= HEARD_AS_SAID, final[0]["transcript"]
    assert done["response"]["status"] in ("completed", "incomplete")
    transcript = done["response"]["output"][0]["content"][0]["transcript"]
    assert words(transcript)  # whatever the model said to what was heard
    # The answer audio, decoded and transcribed again, says the reply's words.
    answer = decode_deltas([e["delta"] for e in client.of_type("response.output_audio.delta")], fmt)
    assert answer.sample_rate == rate and answer.duration_ms > 500
    heard = await transcribe(asr, answer)
    assert heard_within(heard, transcript) >= HEARD_AS_SAID, (heard, transcript)
    latency = json.loads(done["response"]["metadata"]["gateway_latency"])
    assert latency["speech_stopped_ms"] == 0 and latency["transcript_final_ms"] is not None
    assert latency["first_audio_ms"] >= latency["first_token_ms"] >= latency["transcript_final_ms"]


async def test_conversation_is_prefilled_while_the_user_speaks(
    client: RealtimeClient, tts: TtsEngine, question_pcm: np.ndarray
) -> None:
    # Instructions no other test uses: prompt tokens found cached can only come from early prefill.
    instructions = "Early prefill check. Answer in one word."
    await client.send(
        {"type": "session.update", "session": {"instructions": instructions, "output_modalities": ["text"], "max_output_tokens": 4}}
    )
    await client.wait_for("session.updated")
    speech = with_silence(resample(question_pcm, tts.sample_rate, 24000), 24000, 0.5, 1.5)
    await stream_audio(client, encode_chunks(speech, 24000, "audio/pcm"))
    done = await client.wait_for("response.done", timeout=60)
    usage = done["response"]["usage"]
    assert usage["input_token_details"]["cached_tokens"] >= 15, usage


def sample(metrics: str, name: str, **labels: str) -> float:
    """The value of one sample in a /metrics text (0 when it is not there yet)."""
    return next(
        (
            s.value
            for family in text_string_to_metric_families(metrics)
            for s in family.samples
            if s.name == name and s.labels == labels
        ),
        0.0,
    )


async def text_turn_settings(client: RealtimeClient, silence_ms: int) -> None:
    detection = {"type": "server_vad", "silence_duration_ms": silence_ms}
    await client.send(
        {
            "type": "session.update",
            "session": {"output_modalities": ["text"], "temperature": 0, "max_output_tokens": 24,
                        "audio": {"input": {"turn_detection": detection}}},
        }
    )
    await client.wait_for("session.updated")


async def test_reply_is_generated_while_the_vad_waits_out_the_silence(
    gateway: GatewayProcess, client: RealtimeClient, tts: TtsEngine, question_pcm: np.ndarray
) -> None:
    # A long silence window: the speculative transcript is surely ready before the turn is committed.
    await text_turn_settings(client, silence_ms=1500)
    speech = with_silence(resample(question_pcm, tts.sample_rate, 24000), 24000, 0.5, 2.5)
    async with httpx.AsyncClient(base_url=gateway.url, timeout=10) as http:
        before = (await http.get("/metrics")).text
        await stream_audio(client, encode_chunks(speech, 24000, "audio/pcm"))
        done = await client.wait_for("response.done", timeout=60)
        after = (await http.get("/metrics")).text
    latency = json.loads(done["response"]["metadata"]["gateway_latency"])
    # Generation began before the VAD ended the turn: the response took over the preempted stream.
    assert latency["generation_started_ms"] < 0 <= latency["transcript_final_ms"], latency
    preemptions = "gateway_voice_preemptions_total"
    assert sample(after, preemptions, outcome="adopted") - sample(before, preemptions, outcome="adopted") == 1
    # It answers the turn's transcript (what Whisper heard: its words vary by CPU), with what the model said:
    # the text streamed is the reply's text.
    transcript = client.of_type("conversation.item.input_audio_transcription.completed")[0]["transcript"]
    assert words(transcript), transcript
    text = done["response"]["output"][0]["content"][0]["text"]
    streamed = "".join(event["delta"] for event in client.of_type("response.output_text.delta"))
    assert words(text) and streamed == text, (streamed, text)
    # Nothing about the reply was sent before the turn was committed.
    types = [event["type"] for event in client.events]
    assert types.index("input_audio_buffer.committed") < types.index("response.created")


async def test_with_memory_on_the_reply_made_ahead_is_still_taken_over(
    gateway: GatewayProcess, client: RealtimeClient, tts: TtsEngine, question_pcm: np.ndarray
) -> None:
    """Memory puts memories and the memory tool into the reply's prompt: the reply made ahead has them too."""
    async with httpx.AsyncClient(base_url=gateway.url, timeout=60) as http:
        assert (await http.post("/v1/memories/settings", json={"enabled": True})).status_code == 200
        try:
            told = await http.post("/v1/chat/completions", json={"model": MODEL, "max_tokens": 2, "messages": [
                {"role": "user", "content": "Remember that the capital of France is my favourite city."}]})
            fact = told.json()["metadata"]["memories_saved"]
            await text_turn_settings(client, silence_ms=1500)
            speech = with_silence(resample(question_pcm, tts.sample_rate, 24000), 24000, 0.5, 2.5)
            await stream_audio(client, encode_chunks(speech, 24000, "audio/pcm"))
            done = await client.wait_for("response.done", timeout=60)
        finally:
            await http.post("/v1/memories/settings", json={"enabled": False})
            await http.delete("/v1/memories")
    latency = json.loads(done["response"]["metadata"]["gateway_latency"])
    assert latency["generation_started_ms"] < 0 <= latency["transcript_final_ms"], latency
    assert fact and done["response"]["metadata"]["memories_used"] == fact


async def test_speech_that_resumes_cancels_the_preempted_reply(
    gateway: GatewayProcess, client: RealtimeClient, tts: TtsEngine
) -> None:
    await text_turn_settings(client, silence_ms=2500)
    first = resample(tts.synthesize_blocking("Tell me the capital"), tts.sample_rate, 24000)
    second = resample(tts.synthesize_blocking("of France, please."), tts.sample_rate, 24000)
    # Long enough for the speculative transcript and the preempted reply to start on a loaded
    # machine (0.2-0.5 s), shorter than the silence window.
    pause = np.zeros(int(24000 * 1.8), np.int16)
    speech = with_silence(np.concatenate([first, pause, second]), 24000, 0.5, 3.5)
    async with httpx.AsyncClient(base_url=gateway.url, timeout=10) as http:
        before = (await http.get("/metrics")).text
        await stream_audio(client, encode_chunks(speech, 24000, "audio/pcm"))
        done = await client.wait_for("response.done", timeout=60)
        after = (await http.get("/metrics")).text
    assert len(client.of_type("input_audio_buffer.speech_started")) == 1
    assert len(client.of_type("response.created")) == 1
    final = client.of_type("conversation.item.input_audio_transcription.completed")[0]["transcript"]
    # The turn's transcript holds the speech after the pause too: more than "Tell me the capital"'s 4 words.
    assert len(words(final)) > 4, final
    # The reply to "Tell me the capital" was dropped when speech resumed.
    dropped, adopted = "gateway_voice_preemptions_total", {"outcome": "adopted"}
    assert sample(after, dropped, outcome="dropped") - sample(before, dropped, outcome="dropped") >= 1
    assert sample(after, dropped, **adopted) - sample(before, dropped, **adopted) == 1  # the full question's
    # Every transcription of the turn (partials, speculative finals) ran in the short Whisper window.
    windowed = "gateway_asr_windowed_calls"
    assert sample(after, windowed) >= sample(before, windowed) + 3
    assert words(done["response"]["output"][0]["content"][0]["text"])


async def test_idle_timeout_checks_on_a_silent_user(client: RealtimeClient) -> None:
    detection = {"idle_timeout_ms": 5000}
    await client.send(
        {
            "type": "session.update",
            "session": {"output_modalities": ["text"], "max_output_tokens": 20, "audio": {"input": {"turn_detection": detection}}},
        }
    )
    await client.wait_for("session.updated")
    started = time.monotonic()
    sender = asyncio.create_task(stream_audio(client, encode_chunks(np.zeros(24000 * 7, np.int16), 24000, "audio/pcm")))
    timeout = await client.wait_for("input_audio_buffer.timeout_triggered", timeout=15)
    assert time.monotonic() - started >= 5.0
    added = await client.wait_for("conversation.item.added")
    assert added["item"]["id"] == timeout["item_id"] and added["item"]["role"] == "user"
    done = await client.wait_for("response.done", timeout=30)
    assert done["response"]["status"] in ("completed", "incomplete")
    assert done["response"]["output"][0]["content"][0]["text"]
    assert not client.of_type("error")
    sender.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await sender


async def test_manual_turns_commit_and_clear(client: RealtimeClient, tts: TtsEngine, question_pcm: np.ndarray) -> None:
    await client.send({"type": "session.update", "session": {"output_modalities": ["text"], "temperature": 0, "audio": {"input": {"turn_detection": None}}}})
    await client.wait_for("session.updated")
    speech = with_silence(resample(question_pcm, tts.sample_rate, 24000), 24000, 0.2, 0.2)
    for payload in encode_chunks(speech, 24000, "audio/pcm", chunk_ms=200):
        await client.send({"type": "input_audio_buffer.append", "audio": payload})
    await client.send({"type": "input_audio_buffer.clear"})
    await client.wait_for("input_audio_buffer.cleared")
    await client.send({"type": "input_audio_buffer.commit", "event_id": "empty"})
    assert (await client.wait_for("error"))["error"]["code"] == "input_audio_buffer_commit_empty"
    for payload in encode_chunks(speech, 24000, "audio/pcm", chunk_ms=200):
        await client.send({"type": "input_audio_buffer.append", "audio": payload})
    await client.send({"type": "input_audio_buffer.commit"})
    completed = await client.wait_for("conversation.item.input_audio_transcription.completed")
    # The question once: what was cleared is not in the buffer committed (twice over would match 0.66).
    assert heard_as(completed["transcript"], QUESTION) >= HEARD_AS_SAID, completed["transcript"]
    assert not client.of_type("input_audio_buffer.speech_started")  # no VAD in manual mode
    assert not client.of_type("response.created")  # and no automatic response
    await client.send({"type": "response.create"})
    done = await client.wait_for("response.done")
    assert words(done["response"]["output"][0]["content"][0]["text"])


async def test_bad_audio_input(client: RealtimeClient) -> None:
    await client.send({"type": "input_audio_buffer.append", "audio": "AAA"})  # 2 bytes short of pcm16 pairs
    assert (await client.wait_for("error"))["error"]["code"] == "invalid_audio"
    await client.send({"type": "output_audio_buffer.clear"})  # the server holds no playout over a WebSocket
    assert (await client.wait_for("error"))["error"]["code"] == "invalid_value"
    await client.send({"type": "session.update", "session": {"audio": {"input": {"format": {"type": "audio/ogg"}}}}})
    assert (await client.wait_for("error"))["error"]["code"] == "invalid_value"
    # Past the buffer cap (manual turns): refused with an error, the session goes on.
    await client.send({"type": "session.update", "session": {"audio": {"input": {"turn_detection": None}}}})
    await client.wait_for("session.updated")
    second = encode_chunks(np.zeros(24000 * 10, np.int16), 24000, "audio/pcm", chunk_ms=10_000)[0]
    for _ in range(13):
        await client.send({"type": "input_audio_buffer.append", "audio": second})
    assert (await client.wait_for("error"))["error"]["code"] == "input_audio_buffer_full"
    await client.send({"type": "input_audio_buffer.clear"})
    await client.wait_for("input_audio_buffer.cleared")


async def test_barge_in_cancels_and_truncates(
    client: RealtimeClient, tts: TtsEngine, question_pcm: np.ndarray
) -> None:
    await client.send({"type": "session.update", "session": {"temperature": 0, "max_output_tokens": 300}})
    await client.wait_for("session.updated")
    await client.send(
        {"type": "conversation.item.create", "item": {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Tell me a long story about a dragon who loves books."}]}}
    )
    await client.send({"type": "response.create"})
    await client.wait_for("response.output_audio.delta")
    interruption = with_silence(resample(tts.synthesize_blocking("Wait, stop please."), tts.sample_rate, 24000), 24000, 0.0, 1.5)
    onset = time.monotonic()
    sender = asyncio.create_task(stream_audio(client, encode_chunks(interruption, 24000, "audio/pcm")))
    done = await client.wait_for("response.done", timeout=30)
    response = done["response"]
    assert response["status"] == "cancelled" and response["status_details"]["reason"] == "turn_detected"
    audio_events = client.of_type("response.output_audio.delta")
    assert audio_events[-1]["_received_at"] - onset < 2.0  # the story would have gone on much longer
    # The reply is cut to the audio that was sent, so its transcript is shorter than the text generated.
    generated = "".join(e["delta"] for e in client.of_type("response.output_audio_transcript.delta"))
    kept = response["output"][0]["content"][0]["transcript"]
    assert response["output"][0]["status"] == "incomplete" and len(kept) < len(generated)
    await sender
    # The interruption itself is a turn: it is transcribed and answered.
    await client.wait_for("conversation.item.input_audio_transcription.completed", timeout=30)
    assert (await client.wait_for("response.done", timeout=60))["response"]["status"] in ("completed", "incomplete")


async def test_a_spoken_reply_ahead_of_its_playback_leaves_the_engine_to_another_sessions_reply(
    gateway: GatewayProcess, client: RealtimeClient
) -> None:
    """Once a spoken reply's audio plays on for seconds, its next words wait while another session's reply needs
    the engine (the engine counts the rows it left out); it then runs to its end, its transcript whole."""
    await client.send({"type": "session.update", "session": {"temperature": 0, "max_output_tokens": 400}})
    await client.wait_for("session.updated")
    await client.send(
        {"type": "conversation.item.create", "item": {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Tell me a long story about a dragon who loves books."}]}}
    )
    await client.send({"type": "response.create"})
    audio_s = 0.0
    while audio_s < 3.0:  # 24 kHz 16-bit mono: what a listener would still be hearing for seconds
        audio_s += len(base64.b64decode((await client.wait_for("response.output_audio.delta"))["delta"])) / 48000
    other = await RealtimeClient.connect(f"{gateway.ws_url}/v1/realtime")
    async with httpx.AsyncClient(base_url=gateway.url, timeout=10) as http:
        before = sample((await http.get("/metrics")).text, "gateway_engine_decode_rows_paced")
        try:
            assert (await other.recv())["type"] == "session.created"
            await text_turn_settings(other, silence_ms=500)
            answered = await other.ask("What is the capital of France?")
        finally:
            await other.close()
        paced = sample((await http.get("/metrics")).text, "gateway_engine_decode_rows_paced") - before
    assert answered["response"]["output"][0]["content"][0]["text"].strip()
    assert paced > 0
    done = await client.wait_for("response.done", timeout=120)
    assert done["response"]["status"] in ("completed", "incomplete"), done["response"]["status_details"]
    streamed = "".join(e["delta"] for e in client.of_type("response.output_audio_transcript.delta"))
    assert done["response"]["output"][0]["content"][0]["transcript"] == streamed


async def test_push_to_talk_commit_then_response_create_at_once(
    client: RealtimeClient, tts: TtsEngine, question_pcm: np.ndarray
) -> None:
    """The GA manual-turn flow: `commit` and `response.create` back to back. The reply answers what was
    just said, in a new session and in an ongoing one (before, the first failed with empty_conversation
    and the second answered without the new turn)."""
    await client.send({"type": "session.update", "session": {
        "output_modalities": ["text"], "temperature": 0, "audio": {"input": {"turn_detection": None}}}})
    await client.wait_for("session.updated")
    speech = with_silence(resample(question_pcm, tts.sample_rate, 24000), 24000, 0.5, 0.5)
    for turn in range(2):
        for payload in encode_chunks(speech, 24000, "audio/pcm", chunk_ms=200):
            await client.send({"type": "input_audio_buffer.append", "audio": payload})
        await client.send({"type": "input_audio_buffer.commit"})
        await client.send({"type": "response.create"})
        done = await client.wait_for("response.done")
        assert done["response"]["status"] == "completed", done
        types = [event["type"] for event in client.events]
        committed = max(i for i, t in enumerate(types) if t == "input_audio_buffer.committed")
        transcribed = max(i for i, t in enumerate(types) if t == "conversation.item.input_audio_transcription.completed")
        created = max(i for i, t in enumerate(types) if t == "response.created")
        assert committed < transcribed < created, f"turn {turn}: the reply waited for the transcript"
        assert words(done["response"]["output"][0]["content"][0]["text"])
    assert not client.of_type("error")


async def test_a_spoken_question_calls_a_function_and_the_answer_is_spoken(
    client: RealtimeClient, tts: TtsEngine, asr: AsrEngine, question_pcm: np.ndarray
) -> None:
    """By voice: the user asks, the model calls (forced), the client answers the call, the reply is spoken."""
    tool = {"type": "function", "name": "lookup_capital", "description": "The capital city of a country",
            "parameters": {"type": "object", "properties": {"country": {"type": "string", "maxLength": 40}},
                           "required": ["country"], "additionalProperties": False}}
    await client.send({"type": "session.update", "session": {"temperature": 0, "tools": [tool], "tool_choice": "required"}})
    await client.wait_for("session.updated")
    speech = with_silence(resample(question_pcm, tts.sample_rate, 24000), 24000, 0.5, 1.5)
    sender = asyncio.create_task(stream_audio(client, encode_chunks(speech, 24000, "audio/pcm")))
    called = (await client.wait_for("response.done", timeout=90))["response"]
    await sender
    assert [o["type"] for o in called["output"]] == ["function_call"] and called["output"][0]["name"] == "lookup_capital"
    assert not client.of_type("response.output_audio.delta")  # a call is not spoken
    await client.send({"type": "conversation.item.create", "item": {
        "type": "function_call_output", "call_id": called["output"][0]["call_id"], "output": "The capital of France is Paris."}})
    await client.send({"type": "response.create", "response": {"tool_choice": "none"}})
    done = await client.wait_for("response.done", timeout=90)
    assert done["response"]["output"][0]["type"] == "message"
    answer = decode_deltas([e["delta"] for e in client.of_type("response.output_audio.delta")], "audio/pcm")
    transcript = done["response"]["output"][0]["content"][0]["transcript"]
    heard = await transcribe(asr, answer)
    assert answer.duration_ms > 500 and heard_within(heard, transcript) >= HEARD_AS_SAID, (heard, transcript)


async def test_speed_reaches_piper_and_transcription_null_turns_transcripts_off(
    client: RealtimeClient, tts: TtsEngine, question_pcm: np.ndarray
) -> None:
    """`audio.output.speed` changes how long the same reply's audio lasts; `transcription: null` sends no
    transcription events, and the model still answers what was said."""
    durations = {}
    for speed in (1.0, 1.5):
        await client.send({"type": "session.update", "session": {
            "temperature": 0, "max_output_tokens": 20, "audio": {"output": {"speed": speed}}}})
        await client.wait_for("session.updated")
        before = len(client.of_type("response.output_audio.delta"))
        await client.ask("Say: the quick brown fox jumps over the lazy dog.")
        deltas = [e["delta"] for e in client.of_type("response.output_audio.delta")[before:]]
        durations[speed] = decode_deltas(deltas, "audio/pcm").duration_ms
        await client.send({"type": "conversation.item.delete", "item_id": client.of_type("response.done")[-1]["response"]["output"][0]["id"]})
    assert durations[1.5] < 0.8 * durations[1.0], durations
    await client.send({"type": "session.update", "session": {
        "output_modalities": ["text"], "audio": {"input": {"transcription": None, "turn_detection": None}}}})
    updated = await client.wait_for("session.updated")
    assert updated["session"]["audio"]["input"]["transcription"] is None
    speech = with_silence(resample(question_pcm, tts.sample_rate, 24000), 24000, 0.5, 0.5)
    for payload in encode_chunks(speech, 24000, "audio/pcm", chunk_ms=200):
        await client.send({"type": "input_audio_buffer.append", "audio": payload})
    await client.send({"type": "input_audio_buffer.commit"})
    await client.send({"type": "response.create"})
    done = await client.wait_for("response.done")
    # The model answers what was heard (the turn's item holds it) with words of its own.
    spoken = [e["item"] for e in client.of_type("conversation.item.done") if e["item"].get("role") == "user"
              and e["item"]["content"][0]["type"] == "input_audio"]
    assert len(spoken) == 1 and heard_as(spoken[0]["content"][0]["transcript"], QUESTION) >= HEARD_AS_SAID, spoken
    assert words(done["response"]["output"][0]["content"][0]["text"])
    assert not [e for e in client.events if e["type"].startswith("conversation.item.input_audio_transcription")]


async def send_while_receiving(client: RealtimeClient, payloads: list[str]) -> None:
    """Stream paced audio and take in the server's events meanwhile (so their arrival order is kept)."""
    sender = asyncio.create_task(stream_audio(client, payloads))
    while not sender.done():
        with contextlib.suppress(TimeoutError):
            await client.recv(timeout=0.05)
    await sender


async def test_semantic_vad_ends_a_finished_question_sooner_than_a_cut_off_one(
    client: RealtimeClient, tts: TtsEngine
) -> None:
    """semantic_vad (openai-agents' default): after "What is the capital of France?" 1 s of silence is
    enough (both judges find the words finished: 250 ms), after "What is the capital of" it is not
    (unfinished: up to 2 s)."""
    await client.send({"type": "session.update", "session": {"output_modalities": ["text"], "audio": {"input": {
        "turn_detection": {"type": "semantic_vad", "eagerness": "auto", "create_response": False}}}}})
    updated = await client.wait_for("session.updated")
    assert updated["session"]["audio"]["input"]["turn_detection"]["type"] == "semantic_vad"

    def spoken(text: str, silence_s: float) -> list[str]:
        pcm = resample(tts.synthesize_blocking(text), tts.sample_rate, 24000)
        return encode_chunks(with_silence(pcm, 24000, 0.3, silence_s), 24000, "audio/pcm")

    await send_while_receiving(client, spoken("What is the capital of France?", 1.0))
    assert len(client.of_type("input_audio_buffer.speech_stopped")) == 1, "a finished question ends within 1 s"
    if not client.of_type("conversation.item.input_audio_transcription.completed"):
        await client.wait_for("conversation.item.input_audio_transcription.completed")
    await send_while_receiving(client, spoken("What is the capital of", 1.0))
    assert len(client.of_type("input_audio_buffer.speech_stopped")) == 1, "a cut-off one waits longer"
    await send_while_receiving(client, encode_chunks(np.zeros(24000 * 2, np.int16), 24000, "audio/pcm"))
    assert len(client.of_type("input_audio_buffer.speech_stopped")) == 2, "and ends within its longest wait"


async def test_metrics_move_with_a_spoken_turn_and_the_log_holds_no_user_text(
    client: RealtimeClient, gateway: GatewayProcess, tts: TtsEngine, question_pcm: np.ndarray
) -> None:
    """What explains a bench run is in /metrics (per-call ASR and TTS time, queue wait, voice-to-voice,
    barge-in, batch size), and the log (info level, the default) does not hold what the user said."""
    async with httpx.AsyncClient() as http:
        before = (await http.get(f"{gateway.url}/metrics")).text
        await client.send({"type": "session.update", "session": {"temperature": 0, "max_output_tokens": 200}})
        await client.wait_for("session.updated")
        speech = with_silence(resample(question_pcm, tts.sample_rate, 24000), 24000, 0.5, 1.5)
        await stream_audio(client, encode_chunks(speech, 24000, "audio/pcm"))
        await client.wait_for("response.done", timeout=90)
        await client.send({"type": "conversation.item.create", "item": {"type": "message", "role": "user", "content": [
            {"type": "input_text", "text": "Tell me a long story about a dragon."}]}})
        await client.send({"type": "response.create"})
        await client.wait_for("response.output_audio.delta")
        await stream_audio(client, encode_chunks(speech, 24000, "audio/pcm"))  # barge in
        await client.wait_for("response.done", timeout=90)
        after = (await http.get(f"{gateway.url}/metrics")).text
    grew = {
        "asr final": ("gateway_asr_call_seconds_count", {"kind": "final"}),
        "tts clause": ("gateway_tts_clause_seconds_count", {}),
        "queue wait": ("gateway_engine_queue_wait_seconds_count", {"api": "realtime"}),
        "voice to voice": ("gateway_turn_stage_seconds_count", {"stage": "voice_to_voice"}),
        "barge-in": ("gateway_barge_in_seconds_count", {}),
        "batch size": ("gateway_engine_batch_size_count", {}),
    }
    for what, (name, labels) in grew.items():
        assert sample(after, name, **labels) > sample(before, name, **labels), what
    assert sample(after, "gateway_engine_avg_batch_size") >= 1
    log = gateway.log_path.read_text(errors="replace").lower()
    heard = client.of_type("conversation.item.input_audio_transcription.completed")[0]["transcript"]
    assert words(heard) and heard.strip().lower() not in log  # what Whisper heard, whatever its words
    assert "capital of france" not in log and "dragon" not in log
