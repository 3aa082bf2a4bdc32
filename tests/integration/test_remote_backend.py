"""The LLM on a remote server (issue 18): one gateway as the engine of another over /v1/completions with
token-id prompts, through a recording TCP relay that stands in for a cache-aware router.

What must hold: streaming through the front gateway (chat and Realtime), the worker's /v1/completions as
OpenAI's SDK reads it, a cancel that stops the worker's request, the conversation id in the routing
header, and a worker killed and restarted under a live Realtime session."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import time
import urllib.request
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import openai
import pytest

from benchmarks.openai_servers import transformers_serve
from gateway.config import default_cache_dir
from inference.llm.loader import gguf_cache_folder
from inference.models import embedded_llm
from tests.gateway_process import GatewayProcess, start_gateway
from tests.integration.conftest import MODEL
from tests.integration.realtime_client import RealtimeClient

WORKER_KEY = "sk-worker"
ROUTING_HEADER = "x-conversation-id"
TEXT_ONLY = {"type": "session.update", "session": {"output_modalities": ["text"], "temperature": 0, "max_output_tokens": 40}}


class RecordingRelay:
    """A TCP relay on loopback that keeps every byte clients send (to read the headers a router sees)."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.sent = bytearray()
        self.server: asyncio.Server | None = None
        self.port = 0

    async def start(self) -> RecordingRelay:
        self.server = await asyncio.start_server(self._relay, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            writer.close()
            return

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter, record: bool) -> None:
            try:
                while data := await src.read(65536):
                    if record:
                        self.sent.extend(data)
                    dst.write(data)
                    await dst.drain()
            except (ConnectionError, asyncio.CancelledError):
                pass
            finally:
                dst.close()

        with contextlib.suppress(asyncio.CancelledError):  # the relay closing
            await asyncio.gather(pipe(reader, up_writer, True), pipe(up_reader, writer, False))

    def header_values(self, name: str) -> list[str]:
        return re.findall(rf"(?im)^{re.escape(name)}: *([^\r\n]+)\r$", self.sent.decode("latin-1"))

    async def close(self) -> None:
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()


async def text_session(gateway: GatewayProcess) -> RealtimeClient:
    session = await RealtimeClient.connect(f"{gateway.ws_url}/v1/realtime?model={MODEL}")
    await session.recv()
    await session.send(TEXT_ONLY)
    await session.wait_for("session.updated")
    return session


def engine_stat(gateway: GatewayProcess, name: str) -> float:
    with urllib.request.urlopen(f"{gateway.url}/metrics", timeout=5) as response:
        text = response.read().decode()
    match = re.search(rf"^gateway_engine_{name} (\S+)$", text, re.M)
    assert match, name
    return float(match.group(1))


@pytest.fixture(scope="module")
def worker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    process = start_gateway("--no-load-voice-models", "--api-keys", WORKER_KEY,
                            log_path=tmp_path_factory.mktemp("worker") / "gateway.log")
    yield process
    process.stop()


@pytest.fixture
async def relay(worker: GatewayProcess) -> AsyncIterator[RecordingRelay]:
    relay = await RecordingRelay(worker.port).start()
    yield relay
    await relay.close()


def start_front(relay_port: int, log_dir, *extra: str) -> GatewayProcess:
    return start_gateway("--no-load-voice-models", "--llm-backend", f"http://127.0.0.1:{relay_port}/v1",
                         "--llm-backend-api-key", WORKER_KEY, "--llm-backend-breaker-cooldown-s", "0.5", *extra,
                         log_path=log_dir / "front.log")


def test_the_workers_completions_endpoint_speaks_openais_shape(worker: GatewayProcess) -> None:
    client = openai.OpenAI(base_url=f"{worker.url}/v1", api_key=WORKER_KEY)
    question = client.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=4, temperature=0)
    assert question.object == "text_completion" and "Paris" in question.choices[0].text
    assert question.usage is not None and question.usage.prompt_tokens == 5
    # A token-id prompt, streamed (the SDK parses every chunk) and not: the same greedy text.
    ids = [504, 3575, 282, 4649, 314]
    whole = client.completions.create(model=MODEL, prompt=ids, max_tokens=6, temperature=0)
    chunks = list(client.completions.create(model=MODEL, prompt=[ids], max_tokens=6, temperature=0, stream=True,
                                            stream_options={"include_usage": True}))
    assert whole.choices[0].text and "".join(c.choices[0].text for c in chunks if c.choices) == whole.choices[0].text
    assert chunks[-1].usage is not None and chunks[-1].usage.prompt_tokens == len(ids)
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    bad = {"echo": True, "n": 2, "best_of": 2, "logprobs": 1, "suffix": "x", "unknown": 1}
    for field, value in bad.items():
        with pytest.raises(openai.BadRequestError) as refused:
            client.completions.create(model=MODEL, prompt="x", extra_body={field: value})
        assert refused.value.body["param"] == field, field
    for prompt, code in (([10**9], "invalid_value"), ([[1], [2]], "invalid_value"), ([], "invalid_value"),
                         ([1] * 9000, "context_length_exceeded")):
        with pytest.raises(openai.BadRequestError) as refused:
            client.completions.create(model=MODEL, prompt=prompt)
        assert refused.value.body["code"] == code and refused.value.body["param"] == "prompt"


async def test_a_front_gateway_streams_cancels_and_routes_through_the_worker(
    worker: GatewayProcess, relay: RecordingRelay, tmp_path
) -> None:
    front = start_front(relay.port, tmp_path)
    try:
        assert front.health is not None and front.health["llm"]["backend"] == "remote"
        client = openai.AsyncOpenAI(base_url=f"{front.url}/v1", api_key="unused")
        # Chat Completions through the worker: the answer, and the worker counted the request.
        before = engine_stat(worker, "requests_finished")
        reply = await client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "What is the capital of France?"}], temperature=0,
            max_tokens=20)
        assert "Paris" in (reply.choices[0].message.content or "")
        assert engine_stat(worker, "requests_finished") == before + 1
        assert relay.header_values("content-type")  # the relay saw the request

        # Early prefill through the hop: a prepared draft is a 1-token request on the worker, whose
        # prefix cache then serves the message (the worker reports the cached tokens back).
        draft = "Summarise this: " + "the quick brown fox jumps over the lazy dog. " * 20
        async with httpx.AsyncClient(base_url=front.url, timeout=120) as http:  # (the relay runs on this loop)
            conversation = (await http.post("/v1/conversations", json={})).json()["id"]
            finished = engine_stat(worker, "requests_finished")
            prepared = await http.post(f"/v1/conversations/{conversation}/prepare", json={"content": draft})
            assert prepared.status_code == 202
            while engine_stat(worker, "requests_finished") == finished:
                await asyncio.sleep(0.05)
            async with http.stream("POST", f"/v1/conversations/{conversation}/messages",
                                   json={"model": MODEL, "content": draft, "max_tokens": 4, "temperature": 0}) as sse:
                data = [json.loads(line[6:]) async for line in sse.aiter_lines() if line.startswith("data: {")]
        metadata = [d for d in data if d.get("o") == "patch"][-1]["v"][1]["v"]
        assert metadata["prewarmed"] is True
        assert metadata["usage"]["cached_tokens"] >= prepared.json()["prompt_tokens"] - 1

        # A Realtime session: its conversation id travels in the routing header of every request.
        session = await text_session(front)
        done = await session.ask("What is the capital of France?")
        assert done["response"]["status"] == "completed"
        assert "Paris" in done["response"]["output"][0]["content"][0]["text"]

        # Cancel (as a barge-in does): the worker's request stops, and the next turn does not wait for it.
        cancelled = engine_stat(worker, "requests_cancelled")
        await session.send({"type": "conversation.item.create", "item": {
            "type": "message", "role": "user", "content": [{"type": "input_text", "text": "Count from 1 to 500."}]}})
        await session.send({"type": "response.create", "response": {"max_output_tokens": 400}})
        await session.wait_for("response.output_text.delta")
        cancelled_at = time.monotonic()
        await session.send({"type": "response.cancel"})
        stopped = await session.wait_for("response.done")
        assert stopped["response"]["status"] == "cancelled"
        while engine_stat(worker, "requests_cancelled") == cancelled:
            assert time.monotonic() - cancelled_at < 5, "the worker's request did not stop"
            await asyncio.sleep(0.02)
        second = await session.ask("And of Italy?")
        assert second["response"]["status"] == "completed"
        await session.close()
        conversation = done["response"]["conversation_id"]
        assert relay.header_values(ROUTING_HEADER).count(conversation) >= 2
    finally:
        front.stop()


async def test_a_session_survives_its_worker_being_killed_and_restarted(tmp_path) -> None:
    worker = start_gateway("--no-load-voice-models", "--api-keys", WORKER_KEY, log_path=tmp_path / "worker.log")
    front = start_front(worker.port, tmp_path)
    session: RealtimeClient | None = None
    try:
        session = await text_session(front)
        assert (await session.ask("What is the capital of France?"))["response"]["status"] == "completed"

        worker.process.kill()  # type: ignore[union-attr]
        worker.process.wait()  # type: ignore[union-attr]
        failed = await session.ask("And of Italy?")
        assert failed["response"]["status"] == "failed"
        errors = [e for e in session.events if e["type"] == "error"]
        assert errors[-1]["error"]["code"] == "backend_unavailable"
        # A chat completion meanwhile: 503 with Retry-After, OpenAI's error body.
        client = openai.OpenAI(base_url=f"{front.url}/v1", api_key="unused", max_retries=0)
        with pytest.raises(openai.InternalServerError) as down:
            client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=5)
        assert down.value.status_code == 503 and down.value.body["code"] == "backend_unavailable"
        assert down.value.response.headers["retry-after"]

        restarted = start_gateway("--no-load-voice-models", "--api-keys", WORKER_KEY, log_path=tmp_path / "worker2.log",
                                  port=worker.port)
        worker = restarted
        deadline = time.monotonic() + 10
        while True:  # the breaker's cool-down (0.5 s) passes, then one request probes the worker
            again = await session.ask("What is the capital of France?")
            if again["response"]["status"] == "completed" or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.5)
        assert again["response"]["status"] == "completed"
        assert again["response"]["output"][0]["content"][0]["text"].strip()
    finally:
        if session is not None:
            await session.close()
        front.stop()
        worker.stop()


async def test_the_chat_flavour_runs_on_a_server_that_takes_no_token_ids(tmp_path) -> None:
    """`transformers serve` (not ours) behind the chat flavour: the rendered messages go to its
    /v1/chat/completions; chat completions and a Realtime session answer, and a cancel closes its stream."""
    folder = gguf_cache_folder(embedded_llm(), Path(os.environ.get("GATEWAY_CACHE_DIR") or default_cache_dir()))
    with transformers_serve(folder, tmp_path / "transformers-serve.log", timeout_s=120) as url:
        front = start_gateway("--no-load-voice-models", "--llm-backend", f"{url}/v1", "--llm-backend-flavour", "chat",
                              "--llm-backend-model", str(folder), log_path=tmp_path / "front.log")
        try:
            assert front.health is not None and front.health["llm"]["flavour"] == "chat"
            client = openai.AsyncOpenAI(base_url=f"{front.url}/v1", api_key="unused")
            reply = await client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "What is the capital of France?"}], max_tokens=12)
            assert reply.choices[0].message.content and reply.usage is not None and reply.usage.completion_tokens > 0

            session = await text_session(front)
            done = await session.ask("What is the capital of France?")
            assert done["response"]["status"] == "completed"
            assert done["response"]["output"][0]["content"][0]["text"].strip()
            cancelled = engine_stat(front, "requests_cancelled")
            await session.send({"type": "conversation.item.create", "item": {
                "type": "message", "role": "user", "content": [{"type": "input_text", "text": "Count to 500."}]}})
            await session.send({"type": "response.create", "response": {"max_output_tokens": 400}})
            await session.wait_for("response.output_text.delta")
            await session.send({"type": "response.cancel"})
            assert (await session.wait_for("response.done"))["response"]["status"] == "cancelled"
            assert engine_stat(front, "requests_cancelled") == cancelled + 1  # its stream was closed
            await session.close()
        finally:
            front.stop()
