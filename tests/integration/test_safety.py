"""The safety policy on a real gateway: input refused or redacted before the model reads it (typed, spoken,
tool results), output stopped mid-stream (chat, Realtime text and voice), and logs without personal data."""

from __future__ import annotations

import asyncio
import contextlib
import http.server
import json
import os
import re
import threading
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import openai
import pytest
from transformers import AutoTokenizer

from gateway.platform.config import default_cache_dir
from inference.llm.loader import gguf_cache_folder
from inference.models import embedded_llm
from inference.tts import TtsEngine
from media.resample import resample
from tests.gateway_process import GatewayProcess, start_gateway
from tests.integration.conftest import MODEL
from tests.integration.realtime_client import RealtimeClient
from tests.integration.speech import encode_chunks, with_silence
from tests.integration.test_webrtc_call import RATE as RTC_RATE
from tests.integration.test_webrtc_call import call as webrtc_call
from tests.integration.webrtc_peer import loud
from tests.peers import PacedClipTrack

QUESTION = "What is the capital of France?"
EMAIL = "jane.roe@example.org"
CARD = "4111 1111 1111 1111"


@pytest.fixture(scope="module")
def safe_gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    """Denies "Paris" (the model's answer to QUESTION, so output is stopped mid-reply) and "secret project";
    logs at debug level with --log-content, where every frame a WebSocket carries is logged."""
    folder = tmp_path_factory.mktemp("safety")
    denylist = folder / "denylist.txt"
    denylist.write_text("# test denylist\nParis\nsecret project\n", encoding="utf-8")
    process = start_gateway("--safety-denylist", str(denylist), "--log-level", "debug", "--log-content",
                            log_path=folder / "gateway.log")
    yield process
    process.stop()


@pytest.fixture
def client(safe_gateway: GatewayProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{safe_gateway.url}/v1", api_key="unused", max_retries=0)


@pytest.fixture
async def realtime(safe_gateway: GatewayProcess) -> AsyncIterator[RealtimeClient]:
    client = await RealtimeClient.opened(f"{safe_gateway.ws_url}/v1/realtime?model={MODEL}")
    yield client
    await client.close()


def ask(content: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": content}]


def test_blocked_input_is_refused(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model=MODEL, messages=[*ask("hi"), {"role": "assistant", "content": "Hello!"},
                                                              *ask("Tell me about the SECRET project.")], max_tokens=4)
    error = refused.value.body
    assert isinstance(error, dict)
    assert error["code"] == "content_policy_violation" and error["param"] == "messages[2].content"
    assert "denylist" in error["message"]


def test_blocked_tool_result_is_refused(client: openai.OpenAI) -> None:
    call = {"id": "call_1", "type": "function", "function": {"name": "lookup", "arguments": "{}"}}
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model=MODEL, max_tokens=4, messages=[
            *ask("Look it up."), {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "call_1", "content": "the secret project is on"}])
    assert isinstance(refused.value.body, dict) and refused.value.body["param"] == "messages[2].content"


def test_redacted_input_is_what_the_model_reads(client: openai.OpenAI) -> None:
    """The same prompt with the address and with its label is the same prompt, token for token: the model read
    the label. (Greedy, so the replies are the same too.)"""
    def reply(text: str) -> tuple[int, str]:
        completion = client.chat.completions.create(model=MODEL, messages=ask(text), temperature=0, max_tokens=12)
        assert completion.usage is not None
        return completion.usage.prompt_tokens, completion.choices[0].message.content or ""

    raw = reply(f"My e-mail is {EMAIL} and my card is {CARD}. Say hello.")
    labelled = reply("My e-mail is [email] and my card is [payment_card]. Say hello.")
    plain = reply("My e-mail is me and my card is mine. Say hello.")
    assert raw == labelled and raw[0] != plain[0]


def test_redacted_input_is_stored_redacted(client: openai.OpenAI, safe_gateway: GatewayProcess) -> None:
    conversation = httpx.post(f"{safe_gateway.url}/backend-api/conversations", json={}).json()["id"]
    client.chat.completions.create(model=MODEL, messages=ask(f"Write to {EMAIL}."), max_tokens=2,
                                   extra_body={"conversation": conversation})
    stored = httpx.get(f"{safe_gateway.url}/backend-api/conversation/{conversation}").json()
    assert "Write to [email]." in json.dumps(stored) and EMAIL not in json.dumps(stored)


def test_output_is_stopped_mid_reply(client: openai.OpenAI) -> None:
    completion = client.chat.completions.create(model=MODEL, messages=ask(QUESTION), temperature=0, max_tokens=40)
    choice = completion.choices[0]
    assert choice.finish_reason == "content_filter"
    assert "Paris" not in (choice.message.content or "") and (choice.message.content or "").strip()  # what came before
    assert choice.message.refusal == "The reply was stopped by the content policy (rule: denylist)."
    # Stopped at once: the engine generated no more than a step past the match, far from the 40 allowed.
    assert completion.usage is not None and completion.usage.completion_tokens < 20


def test_a_json_reply_that_is_stopped_is_a_refusal(client: openai.OpenAI) -> None:
    """Cut short, the JSON would not parse: the content is null and the refusal says why (structured outputs)."""
    completion = client.chat.completions.create(
        model=MODEL, messages=ask(f"{QUESTION} Answer in JSON with the key city."), temperature=0, max_tokens=40,
        response_format={"type": "json_schema", "json_schema": {"name": "city", "schema": {
            "type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Lyon"]}},
            "required": ["city"]}}})
    choice = completion.choices[0]
    assert choice.finish_reason == "content_filter" and choice.message.content is None
    assert choice.message.refusal is not None and "denylist" in choice.message.refusal


def test_streamed_output_is_stopped_mid_reply(client: openai.OpenAI) -> None:
    chunks = list(client.chat.completions.create(model=MODEL, messages=ask(QUESTION), temperature=0, max_tokens=40,
                                                 stream=True, stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    reasons = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert reasons == ["content_filter"] and "Paris" not in text and text.strip()
    refusals = [c.choices[0].delta.refusal for c in chunks if c.choices and c.choices[0].delta.refusal]
    assert refusals == ["The reply was stopped by the content policy (rule: denylist)."]
    usage = chunks[-1].usage
    assert usage is not None and usage.completion_tokens < 20


def test_text_completions_are_screened_both_ways(client: openai.OpenAI) -> None:
    """/v1/completions: a blocked prompt is refused, a redacted one is what the model reads (as text and as token
    ids), and the output is stopped mid-stream."""
    with pytest.raises(openai.BadRequestError) as refused:
        client.completions.create(model=MODEL, prompt="All about the secret project:", max_tokens=4)
    assert isinstance(refused.value.body, dict) and refused.value.body["code"] == "content_policy_violation"
    assert refused.value.body["param"] == "prompt"

    def read(prompt: str | list[int]) -> int:
        completion = client.completions.create(model=MODEL, prompt=prompt, max_tokens=1, temperature=0)
        assert completion.usage is not None
        return completion.usage.prompt_tokens

    labelled = read("Write to [email] today.")
    assert read(f"Write to {EMAIL} today.") == labelled != read("Write to me today.")
    # The folder the gateway converted the embedded model into (it has started, so the folder is there).
    folder = gguf_cache_folder(embedded_llm(), Path(os.environ.get("GATEWAY_CACHE_DIR") or default_cache_dir()))
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    assert read(tokenizer(f"Write to {EMAIL} today.")["input_ids"]) == labelled

    prompt = "Question: What is the capital of France?\nAnswer: The capital of France is"
    stopped = client.completions.create(model=MODEL, prompt=prompt, max_tokens=20, temperature=0)
    assert stopped.choices[0].finish_reason == "content_filter" and "Paris" not in stopped.choices[0].text
    streamed = list(client.completions.create(model=MODEL, prompt=prompt, max_tokens=20, temperature=0, stream=True))
    assert [c.choices[0].finish_reason for c in streamed if c.choices[0].finish_reason] == ["content_filter"]
    assert "Paris" not in "".join(c.choices[0].text for c in streamed)


async def test_realtime_blocked_item_and_redacted_item(realtime: RealtimeClient) -> None:
    await realtime.send({"type": "conversation.item.create", "event_id": "evt_blocked", "item": {
        "type": "message", "role": "user", "content": [{"type": "input_text", "text": "Tell me the secret project"}]}})
    error = await realtime.wait_for("error")
    assert error["error"]["code"] == "content_policy_violation" and error["error"]["event_id"] == "evt_blocked"
    assert not realtime.of_type("conversation.item.added")
    await realtime.send({"type": "conversation.item.create", "item": {
        "type": "message", "role": "user", "content": [{"type": "input_text", "text": f"Mail {EMAIL} now"}]}})
    added = await realtime.wait_for("conversation.item.added")
    assert added["item"]["content"][0]["text"] == "Mail [email] now"


async def test_realtime_text_reply_is_stopped(realtime: RealtimeClient) -> None:
    await realtime.send({"type": "session.update", "session": {"type": "realtime", "output_modalities": ["text"]}})
    done = await realtime.ask(QUESTION, max_output_tokens=40)
    response = done["response"]
    assert response["status"] == "incomplete"
    assert response["status_details"]["reason"] == "content_filter"
    text = response["output"][0]["content"][0]["text"]
    assert "Paris" not in text and text.strip()
    deltas = "".join(e["delta"] for e in realtime.of_type("response.output_text.delta"))
    assert deltas == text and response["usage"]["output_tokens"] < 20


async def speak(client: RealtimeClient, tts: TtsEngine, text: str) -> None:
    pcm = with_silence(resample(tts.synthesize_blocking(text), tts.sample_rate, 24000), 24000, 0.5, 1.5)
    started = asyncio.get_running_loop().time()
    for index, payload in enumerate(encode_chunks(pcm, 24000, "audio/pcm")):
        await client.send({"type": "input_audio_buffer.append", "audio": payload})
        await asyncio.sleep(max(0.0, started + (index + 1) * 0.02 - asyncio.get_running_loop().time()))


async def test_voice_reply_is_stopped(realtime: RealtimeClient, tts: TtsEngine, question_pcm: np.ndarray) -> None:
    # The reply must say the denied word, so the model must hear the question: Whisper gets it as its prompt,
    # which holds it to these words on any CPU (unprompted, AVX2 kernels once heard "France" as "friends").
    await realtime.send({"type": "session.update", "session": {"type": "realtime", "output_modalities": ["audio"],
                                                               "audio": {"input": {"transcription": {"prompt": QUESTION}}}}})
    await realtime.wait_for("session.updated")
    sender = asyncio.create_task(speak(realtime, tts, QUESTION))
    done = await realtime.wait_for("response.done", timeout=90)
    await sender
    response = done["response"]
    assert response["status"] == "incomplete" and response["status_details"]["reason"] == "content_filter"
    transcript = response["output"][0]["content"][0]["transcript"]
    assert "Paris" not in transcript
    spoken = "".join(e["delta"] for e in realtime.of_type("response.output_audio_transcript.delta"))
    assert "Paris" not in spoken


async def test_spoken_input_is_refused(realtime: RealtimeClient, tts: TtsEngine) -> None:
    sender = asyncio.create_task(speak(realtime, tts, "Tell me about the secret project."))
    error = await realtime.wait_for("error", timeout=90)
    await sender
    assert error["error"]["code"] == "content_policy_violation"
    failed = await realtime.wait_for("conversation.item.input_audio_transcription.failed")
    assert failed["error"]["code"] == "content_policy_violation"
    done = await realtime.wait_for("conversation.item.done")
    assert done["item"]["status"] == "incomplete" and done["item"]["content"][0]["transcript"] == ""
    await asyncio.sleep(1.0)
    assert not realtime.of_type("response.created")


# Issue 28's reports: each was stored as [phone] (or partly), and refused in block mode.
ORDINARY_NUMBERS = ["123 456 789 dollars", "192.168.100.200", "100 200 300 400 500", "Order #2024-0012-3344",
                    "123-45-6789", "8 100 000 000", "2 4 6 8 10 12 14 16 18", "2024-01-15 10:30"]


@pytest.fixture(scope="module")
def blocking_gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    """--safety-pii block: personal data refuses the message."""
    process = start_gateway("--safety-pii", "block", "--no-load-voice-models",
                            log_path=tmp_path_factory.mktemp("pii-block") / "gateway.log")
    yield process
    process.stop()


def user_texts(conversation: dict[str, Any]) -> list[str]:
    return [part["text"] for message in conversation["messages"] if message["role"] == "user"
            for part in message["content"]]


@pytest.mark.parametrize("mode", ["redact", "block"])
def test_ordinary_numbers_reach_the_model_and_the_store_unchanged(mode: str, request: pytest.FixtureRequest) -> None:
    """Each sent as a chat user message with a conversation, then read back with GET /backend-api/conversation/{id}: the
    same text (redact), and not refused (block); a phone number beside them is still found."""
    process: GatewayProcess = request.getfixturevalue({"redact": "gateway", "block": "blocking_gateway"}[mode])
    with httpx.Client(base_url=process.url, timeout=120) as http:
        for text in [*ORDINARY_NUMBERS, "; ".join(ORDINARY_NUMBERS)]:
            conversation = http.post("/backend-api/conversations", json={}).json()["id"]
            answer = http.post("/v1/chat/completions", json={
                "model": MODEL, "max_tokens": 1, "messages": ask(text), "conversation": conversation})
            assert answer.status_code == 200, (text, answer.text)
            assert user_texts(http.get(f"/backend-api/conversation/{conversation}").json()) == [text]
        conversation = http.post("/backend-api/conversations", json={}).json()["id"]
        phone = http.post("/v1/chat/completions", json={
            "model": MODEL, "max_tokens": 1, "messages": ask("Call me at (415) 555-0132 after 10:30."),
            "conversation": conversation})
        if mode == "block":
            assert phone.status_code == 400 and phone.json()["error"]["code"] == "content_policy_violation"
        else:
            assert user_texts(http.get(f"/backend-api/conversation/{conversation}").json()) == ["Call me at [phone] after 10:30."]


def personal_data(log: Path) -> list[str]:
    text = log.read_text(errors="replace")
    digits = re.sub(r"\D", "", CARD)
    return [found for found in (EMAIL, CARD, digits, "jane.roe") if found in text]


@pytest.fixture(scope="module")
def open_gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    """No policy on the model (--no-safety): the address and the card reach the model, its reply, the stored
    conversation and --log-content's records, and the SQL that aiosqlite logs at debug level."""
    folder = tmp_path_factory.mktemp("open")
    process = start_gateway("--no-safety", "--log-level", "debug", "--log-content", "--no-load-voice-models",
                            log_path=folder / "gateway.log")
    yield process
    process.stop()


@pytest.mark.parametrize("which", ["debug_content_no_policy", "debug_content", "info"])
async def test_logs_hold_no_personal_data(which: str, request: pytest.FixtureRequest) -> None:
    """A full conversation with an address and a card number, typed (stored, plain and streamed) and over the
    Realtime API: at debug level with --log-content, with and without the policy, and at info, the log holds
    neither."""
    name = {"debug_content_no_policy": "open_gateway", "debug_content": "safe_gateway", "info": "gateway"}[which]
    process: GatewayProcess = request.getfixturevalue(name)
    said = f"My e-mail is {EMAIL} and my card number is {CARD}. Repeat them."
    async with httpx.AsyncClient(base_url=process.url, timeout=120) as http:
        conversation = (await http.post("/backend-api/conversations", json={})).json()["id"]
        for stream in (False, True):
            answer = await http.post("/v1/chat/completions", json={
                "model": MODEL, "max_tokens": 8, "stream": stream, "messages": ask(said), "conversation": conversation})
            assert answer.status_code == 200
        if which == "debug_content_no_policy":  # the data did go through: only the log filter keeps it out
            assert EMAIL in json.dumps((await http.get(f"/backend-api/conversation/{conversation}")).json())
    client = await RealtimeClient.connect(f"{process.ws_url}/v1/realtime?model={MODEL}")
    await client.wait_for("session.created")
    await client.send({"type": "session.update", "session": {"type": "realtime", "output_modalities": ["text"]}})
    await client.ask(said, max_output_tokens=8)
    await client.close()
    await asyncio.sleep(0.5)
    if which.startswith("debug"):
        assert "[email]" in process.log_path.read_text(errors="replace")  # the content was logged, redacted
    assert personal_data(process.log_path) == []


class Moderation(http.server.BaseHTTPRequestHandler):
    """OpenAI's /v1/moderations shape, slowly: flags any text with "dragon" in it after DELAY_S; or, while a test
    holds the verdicts (held_verdicts), only once the test lets them go."""

    DELAY_S = 0.6
    HOLD_S = 30.0  # a held verdict goes out by itself after this, and is counted in `held_too_long`
    inputs: list[str] = []
    hold: threading.Event | None = None
    held_too_long: list[str] = []

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        body = json.loads(self.rfile.read(int(self.headers["content-length"])))
        Moderation.inputs.append(body["input"])
        hold = Moderation.hold
        if hold is None:
            time.sleep(self.DELAY_S)
        elif not hold.wait(self.HOLD_S):
            Moderation.held_too_long.append(body["input"])
        flagged = "dragon" in body["input"].lower()
        answer = json.dumps({"id": "modr-1", "model": "test", "results": [
            {"flagged": flagged, "categories": {"violence": flagged}, "category_scores": {"violence": 0.9 * flagged}}]})
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer.encode())

    def log_message(self, *args: object) -> None:
        pass


@contextlib.contextmanager
def held_verdicts() -> Iterator[threading.Event]:
    """No verdict goes out until the test sets the event it is given. A test that sets it once it has seen the
    reply's first text knows, whatever the machine's speed, that the reply did not wait for the classifier
    (one that waited would show no text until HOLD_S ran out: `held_too_long`)."""
    release = threading.Event()
    Moderation.inputs.clear()
    Moderation.held_too_long.clear()
    Moderation.hold = release
    try:
        yield release
    finally:
        Moderation.hold = None
        release.set()


@pytest.fixture(scope="module")
def moderated_gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Moderation)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{server.server_address[1]}/v1/moderations"
    # A verdict held by a test is not given up on (fail open) before the test lets it go.
    process = start_gateway("--safety-classifier", url, "--safety-classifier-timeout-s", str(2 * Moderation.HOLD_S),
                            "--no-load-voice-models", log_path=tmp_path_factory.mktemp("moderated") / "gateway.log")
    warm = httpx.post(f"{process.url}/v1/chat/completions", timeout=60,  # a fresh engine's first steps are slow
                      json={"model": MODEL, "max_tokens": 4, "messages": ask("Hello!")})
    assert warm.status_code == 200
    yield process
    process.stop()
    server.shutdown()
    thread.join()


def test_a_slow_classifier_runs_beside_and_stops_the_reply(moderated_gateway: GatewayProcess) -> None:
    client = openai.OpenAI(base_url=f"{moderated_gateway.url}/v1", api_key="unused", max_retries=0)
    chunks = []
    with held_verdicts() as release:
        for chunk in client.chat.completions.create(model=MODEL, messages=ask("Tell me a long story about a dragon."),
                                                    temperature=0, max_tokens=400, stream=True,
                                                    stream_options={"include_usage": True}):
            chunks.append(chunk)
            if chunk.choices and chunk.choices[0].delta.content:
                release.set()  # text came while the verdict on the question was held: it did not wait for it
        held_too_long = list(Moderation.held_too_long)
    assert release.is_set() and held_too_long == []  # the first token never waited for the classifier
    reasons = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert reasons == ["content_filter"]
    usage = chunks[-1].usage
    assert usage is not None and usage.completion_tokens < 400  # stopped once the verdict came
    assert Moderation.inputs[0] == "Tell me a long story about a dragon."


def test_an_unflagged_reply_completes_after_its_last_verdict(moderated_gateway: GatewayProcess) -> None:
    client = openai.OpenAI(base_url=f"{moderated_gateway.url}/v1", api_key="unused", max_retries=0)
    Moderation.inputs.clear()
    completion = client.chat.completions.create(model=MODEL, messages=ask(QUESTION), temperature=0, max_tokens=20)
    content = completion.choices[0].message.content or ""
    assert completion.choices[0].finish_reason in ("stop", "length") and content.strip()
    assert Moderation.inputs == [QUESTION, content]  # the question at once, the whole reply at its end


async def test_realtime_reply_stopped_by_the_classifier(moderated_gateway: GatewayProcess) -> None:
    client = await RealtimeClient.connect(f"{moderated_gateway.ws_url}/v1/realtime?model={MODEL}")
    await client.wait_for("session.created")
    await client.send({"type": "session.update", "session": {"type": "realtime", "output_modalities": ["text"]}})
    with held_verdicts() as release:
        await client.send({"type": "conversation.item.create", "item": {"type": "message", "role": "user", "content": [
            {"type": "input_text", "text": "Tell me a long story about a dragon."}]}})
        await client.send({"type": "response.create", "response": {"max_output_tokens": 400}})
        await client.wait_for("response.output_text.delta")
        release.set()  # the reply's text came while the verdict on the question was held
        done = await client.wait_for("response.done")
        held_too_long = list(Moderation.held_too_long)
    await client.close()
    assert held_too_long == [] and Moderation.inputs[0] == "Tell me a long story about a dragon."
    response = done["response"]
    assert response["status"] == "incomplete" and response["status_details"]["reason"] == "content_filter"
    assert 0 < response["usage"]["output_tokens"] < 400  # begun before the verdict, stopped by it
    assert response["output"][0]["content"][0]["text"]
    marks = json.loads(response["metadata"]["gateway_latency"])
    assert marks["first_token_ms"] < marks["classifier_done_ms"]


def test_streaming_conversation_api(safe_gateway: GatewayProcess) -> None:
    """POST /backend-api/conversation/{id}/messages: refused, redacted, and a reply stopped mid-stream."""
    base = safe_gateway.url
    conversation = httpx.post(f"{base}/backend-api/conversations", json={}).json()["id"]
    refused = httpx.post(f"{base}/backend-api/conversation/{conversation}/messages",
                         json={"model": MODEL, "content": "The secret project, please."})
    assert refused.status_code == 400 and refused.json()["error"]["code"] == "content_policy_violation"
    prepared = httpx.post(f"{base}/backend-api/conversation/{conversation}/prepare", json={"content": "The secret project"})
    assert prepared.status_code == 400  # nor is a refused draft prefilled
    stream = httpx.post(f"{base}/backend-api/conversation/{conversation}/messages", timeout=120,
                        json={"model": MODEL, "content": f"Mail {EMAIL}: {QUESTION}", "temperature": 0, "max_tokens": 40})
    events = [json.loads(line[6:]) for line in stream.text.splitlines() if line.startswith("data: {")]
    text = "".join(e["v"] for e in events if isinstance(e.get("v"), str))
    final = next(e for e in events if e.get("o") == "patch")["v"]
    assert final[0]["v"] == "incomplete" and final[1]["v"]["finish_reason"] == "content_filter"
    assert "Paris" not in text
    stored = json.dumps(httpx.get(f"{base}/backend-api/conversation/{conversation}").json())
    assert f"Mail [email]: {QUESTION}" in stored, stored
    assert EMAIL not in stored, stored
    assert "Paris" not in stored, stored


async def test_voice_reply_over_webrtc_is_stopped_and_its_audio_cleared(
    safe_gateway: GatewayProcess, tts: TtsEngine, question_pcm: np.ndarray, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The denied word stops the spoken answer: the audio not yet played is cleared, as in a barge-in."""
    monkeypatch.setattr("aioice.ice.get_host_addresses", lambda use_ipv4, use_ipv6: ["127.0.0.1"])
    silence = np.zeros(RTC_RATE * 20, np.int16)
    caller = await webrtc_call(safe_gateway, PacedClipTrack(silence), {"temperature": 0})
    try:
        await caller.wait_for("session.created")
        caller.send({"type": "conversation.item.create", "item": {"type": "message", "role": "user", "content": [
            {"type": "input_text", "text": "Describe France in three sentences."}]}})  # Paris comes late
        caller.send({"type": "response.create", "response": {"max_output_tokens": 200}})
        done = await caller.wait_for("response.done", timeout=90)
        response = done["response"]
        assert response["status"] == "incomplete" and response["status_details"]["reason"] == "content_filter"
        assert "Paris" not in response["output"][0]["content"][0]["transcript"]
        cleared = await caller.wait_for("output_audio_buffer.cleared", timeout=5)
        assert cleared["response_id"] == response["id"]
        assert any(loud(pcm) for at, pcm in caller.received if at <= cleared["_at"])  # its start was being heard
        await asyncio.sleep(1.0)
        # Nothing more of the answer was heard (0.3 s: frames in flight and in the caller's receive buffer).
        assert not any(loud(pcm) for at, pcm in caller.received if at > cleared["_at"] + 0.3)
    finally:
        async with httpx.AsyncClient(base_url=safe_gateway.url) as http:
            await http.post(f"{caller.call_url}/hangup")
        await caller.pc.close()
