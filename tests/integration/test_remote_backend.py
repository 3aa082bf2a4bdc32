"""The LLM on a remote server (issue 18): one gateway as the engine of another over /v1/completions with
token-id prompts, through a recording TCP relay that stands in for a cache-aware router.

What must hold: streaming through the front gateway (chat and Realtime), the worker's /v1/completions as
OpenAI's SDK reads it, a cancel that stops the worker's request, the conversation id in the routing
header of every request of a conversation whatever its API (issue 28), and a worker killed and restarted
under a live Realtime session. Against a server that answers as llama.cpp's does (llama_like.py, issue 28):
the gateway falls back to the chat flavour, refuses to start when the model is not served, and never
passes a server's error body (which lists the prompt) to a client or to its log."""

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
from gateway.platform.config import default_cache_dir
from inference.llm.loader import gguf_cache_folder
from inference.models import embedded_llm
from tests.gateway_process import GatewayProcess, start_gateway
from tests.integration.conftest import MODEL
from tests.integration.llama_like import LlamaLikeServer
from tests.integration.realtime_client import RealtimeClient

WORKER_KEY = "sk-worker"
ROUTING_HEADER = "x-conversation-id"
TEXT_ONLY = {"type": "session.update", "session": {"output_modalities": ["text"], "temperature": 0, "max_output_tokens": 40}}


_HEAD = re.compile(rb"(?:GET|POST) (\S+) HTTP/1\.1\r\n(.*?\r\n)\r\n", re.S)


class RecordingRelay:
    """A TCP relay on loopback that keeps every byte clients send (to read the headers a router sees)."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.sent = bytearray()
        self.requests: list[tuple[str, dict[str, str]]] = []  # each request's path and headers, as they came
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

        connection = bytearray()
        parsed = 0  # where the next request's head may start

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter, record: bool) -> None:
            nonlocal parsed
            try:
                while data := await src.read(65536):
                    if record:
                        self.sent.extend(data)
                        connection.extend(data)
                        for head in _HEAD.finditer(connection, parsed):
                            headers = re.findall(rb"(?m)^([\w-]+): *([^\r\n]*)\r$", head[2])
                            self.requests.append((head[1].decode(), {k.decode().lower(): v.decode() for k, v in headers}))
                            parsed = head.end()
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


async def start_front(relay_port: int, log_dir, *extra: str) -> GatewayProcess:
    """In a thread: the relay runs on this loop, and the front's start probes the worker through it (a
    start that blocked the loop waited out the probe's read timeout)."""
    args = ("--no-load-voice-models", "--llm-backend", f"http://127.0.0.1:{relay_port}/v1",
            "--llm-backend-api-key", WORKER_KEY, "--llm-backend-breaker-cooldown-s", "0.5", *extra)
    return await asyncio.to_thread(start_gateway, *args, log_path=log_dir / "front.log")


def test_the_workers_completions_endpoint_speaks_openais_shape(worker: GatewayProcess) -> None:
    client = openai.OpenAI(base_url=f"{worker.url}/v1", api_key=WORKER_KEY)
    question = client.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=4, temperature=0)
    assert question.object == "text_completion" and question.choices[0].text.strip()
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
    probed = engine_stat(worker, "requests_finished") + 1  # the front's probe at start: one 1-token request
    front = await start_front(relay.port, tmp_path)
    try:
        assert front.health is not None and front.health["llm"]["backend"] == "remote"
        client = openai.AsyncOpenAI(base_url=f"{front.url}/v1", api_key="unused")
        while (before := engine_stat(worker, "requests_finished")) < probed:  # (its answer may come first)
            await asyncio.sleep(0.02)
        # Chat Completions through the worker: the answer, and the worker counted the request.
        asked = {"model": MODEL, "messages": [{"role": "user", "content": "What is the capital of France?"}],
                 "temperature": 0, "max_tokens": 20}
        reply = await client.chat.completions.create(**asked)
        assert engine_stat(worker, "requests_finished") == before + 1
        assert relay.header_values("content-type")  # the relay saw the request
        # The worker's own greedy answer to the same request, whatever its words.
        own = await openai.AsyncOpenAI(base_url=f"{worker.url}/v1", api_key=WORKER_KEY).chat.completions.create(**asked)
        answer = reply.choices[0].message.content or ""
        assert answer.strip() and answer == own.choices[0].message.content

        # Early prefill through the hop: a prepared draft is a 1-token request on the worker, whose
        # prefix cache then serves the message (the worker reports the cached tokens back).
        draft = "Summarise this: " + "the quick brown fox jumps over the lazy dog. " * 20
        async with httpx.AsyncClient(base_url=front.url, timeout=120) as http:  # (the relay runs on this loop)
            conversation = (await http.post("/backend-api/conversations", json={})).json()["id"]
            finished = engine_stat(worker, "requests_finished")
            prepared = await http.post(f"/backend-api/conversation/{conversation}/prepare", json={"content": draft})
            assert prepared.status_code == 202
            while engine_stat(worker, "requests_finished") == finished:
                await asyncio.sleep(0.05)
            async with http.stream("POST", f"/backend-api/conversation/{conversation}/messages",
                                   json={"model": MODEL, "content": draft, "max_tokens": 4, "temperature": 0}) as sse:
                data = [json.loads(line[6:]) async for line in sse.aiter_lines() if line.startswith("data: {")]
        metadata = [d for d in data if d.get("o") == "patch"][-1]["v"][1]["v"]
        assert metadata["prewarmed"] is True
        assert metadata["usage"]["cached_tokens"] >= prepared.json()["prompt_tokens"] - 1

        # A Realtime session: its conversation id travels in the routing header of every request.
        session = await text_session(front)
        done = await session.ask("What is the capital of France?")
        assert done["response"]["status"] == "completed"
        assert done["response"]["output"][0]["content"][0]["text"].strip()

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
    front = await start_front(worker.port, tmp_path)
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


async def test_every_request_of_a_conversation_carries_its_routing_key(
    worker: GatewayProcess, relay: RecordingRelay, tmp_path
) -> None:
    """Issue 28: whichever API a conversation's request came through (the conversation API's prepare and
    messages, a chat completion with `conversation`, Realtime), the worker's request carries the
    conversation's id, so that a router hashing the header sends them all to the worker that caches it."""
    front = await start_front(relay.port, tmp_path)
    seen: dict[str, list[str | None]] = {}

    def keys_since(mark: int) -> list[str | None]:
        return [headers.get(ROUTING_HEADER) for path, headers in relay.requests[mark:]]

    try:
        async with httpx.AsyncClient(base_url=front.url, timeout=120) as http:  # (the relay runs on this loop)
            question = "Please tell me everything you know about the history of Rome."
            conversation = (await http.post("/backend-api/conversations", json={})).json()["id"]
            mark, finished = len(relay.requests), engine_stat(worker, "requests_finished")
            prepared = await http.post(f"/backend-api/conversation/{conversation}/prepare", json={"content": question})
            assert prepared.status_code == 202
            while len(relay.requests) == mark or engine_stat(worker, "requests_finished") == finished:
                await asyncio.sleep(0.05)
            seen["prepare"], mark = keys_since(mark), len(relay.requests)
            async with http.stream("POST", f"/backend-api/conversation/{conversation}/messages",
                                   json={"model": MODEL, "content": question, "max_tokens": 4}) as sse:
                events = [json.loads(line[6:]) async for line in sse.aiter_lines() if line.startswith("data: {")]
            seen["messages"] = keys_since(mark)
            # A remote backend takes no grammar: the title is the user's first words, and asks the worker nothing.
            titled = [e for e in events if e.get("type") == "title_generation"]
            assert titled and titled[0]["title"] == "Please tell me everything you know"
            assert (await http.get(f"/backend-api/conversation/{conversation}")).json()["title"] == titled[0]["title"]

            attached = (await http.post("/backend-api/conversations", json={})).json()["id"]
            client = openai.AsyncOpenAI(base_url=f"{front.url}/v1", api_key="unused")
            mark = len(relay.requests)
            await client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}],
                                                 max_tokens=4, extra_body={"conversation": attached})
            stream = await client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "And then?"}], max_tokens=4, stream=True,
                extra_body={"conversation": attached})
            assert [chunk async for chunk in stream]
            seen["chat"] = keys_since(mark)

        session = await text_session(front)
        mark = len(relay.requests)
        done = await session.ask("What is the capital of France?")
        seen["realtime"] = keys_since(mark)
        await session.close()
    finally:
        front.stop()
    expected = {"prepare": conversation, "messages": conversation, "chat": attached,
                "realtime": done["response"]["conversation_id"]}
    for api, keys in seen.items():
        assert keys and set(keys) == {expected[api]}, (api, keys)


def test_a_backend_that_takes_no_token_ids_gets_the_chat_flavour_and_keeps_its_errors(
    worker: GatewayProcess, tmp_path
) -> None:
    """Issue 28: llama.cpp's server refuses token-id prompts with a 500 whose body lists them. The gateway
    finds out at start and takes the chat flavour; when the server fails, the client gets 502
    `backend_error` in words of the gateway's own, and neither the body nor the user's words reach the log."""
    secret = "my locker code is walrus tangerine"
    with LlamaLikeServer(worker.url, WORKER_KEY, MODEL, served=["smol"]) as llama:
        front = start_gateway("--no-load-voice-models", "--llm-backend", llama.url, "--llm-backend-model", "smol",
                              log_path=tmp_path / "front.log")
        try:
            assert front.health is not None and front.health["llm"]["flavour"] == "chat"
            client = openai.OpenAI(base_url=f"{front.url}/v1", api_key="unused", max_retries=0)
            asked = {"model": MODEL, "messages": [{"role": "user", "content": "What is the capital of France?"}],
                     "temperature": 0, "max_tokens": 12}
            reply = client.chat.completions.create(**asked)
            own = openai.OpenAI(base_url=f"{worker.url}/v1", api_key=WORKER_KEY).chat.completions.create(**asked)
            answer = reply.choices[0].message.content or ""
            assert answer.strip() and answer == own.choices[0].message.content  # the worker's greedy answer

            llama.failing = True
            with pytest.raises(openai.APIStatusError) as failed:
                client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": secret}], max_tokens=5)
            assert failed.value.status_code == 502 and failed.value.body["code"] == "backend_error"
            assert failed.value.body["type"] == "server_error" and failed.value.body["message"]
            streamed = httpx.post(f"{front.url}/v1/chat/completions", timeout=60, json={
                "model": MODEL, "messages": [{"role": "user", "content": secret}], "max_tokens": 5, "stream": True})
            for answer in (failed.value.response.text, streamed.text):
                assert "backend_error" in answer
                assert "walrus" not in answer and "validation" not in answer, answer
        finally:
            front.stop()
    log = front.log_path.read_text()
    assert [line for line in log.splitlines() if "takes no token-id prompts" in line], "the fallback was not logged"
    assert "answered 500" in log  # the failure is logged, redacted
    assert "walrus" not in log and "locker" not in log


def test_a_token_flavoured_backends_error_body_lists_no_token_ids_in_the_log(worker: GatewayProcess, tmp_path) -> None:
    """A server that takes token ids keeps the token flavour; when it fails, its body (the prompt's ids)
    reaches neither the client nor the log."""
    with LlamaLikeServer(worker.url, WORKER_KEY, MODEL, served=[MODEL], takes_token_ids=True) as llama:
        front = start_gateway("--no-load-voice-models", "--llm-backend", llama.url, log_path=tmp_path / "front.log")
        try:
            assert front.health is not None and front.health["llm"]["flavour"] == "token"
            llama.failing = True
            answer = httpx.post(f"{front.url}/v1/chat/completions", timeout=60, json={
                "model": MODEL, "messages": [{"role": "user", "content": "walrus tangerine"}], "max_tokens": 5})
            assert answer.status_code == 502 and answer.json()["error"]["code"] == "backend_error"
        finally:
            front.stop()
    (ids,) = {tuple(prompt) for prompt in llama.refused}  # the prompt, the user's words among it
    log = front.log_path.read_text()
    for listed in {", ".join(str(i) for i in ids[at:at + 4]) for at in range(len(ids) - 3)}:
        assert listed not in answer.text and listed not in log
    assert "walrus" not in log


def test_a_backend_that_does_not_serve_the_model_stops_the_start_with_one_line(worker: GatewayProcess, tmp_path) -> None:
    with LlamaLikeServer(worker.url, WORKER_KEY, MODEL, served=["another-model"]) as llama:
        with pytest.raises(RuntimeError, match=r"does not serve the model 'smol' \(it serves: another-model\)"):
            start_gateway("--no-load-voice-models", "--llm-backend", llama.url, "--llm-backend-model", "smol",
                          log_path=tmp_path / "front.log").stop()  # (stopped if it started after all)
    log = (tmp_path / "front.log").read_text()
    assert len([line for line in log.splitlines() if "--llm-backend-model" in line]) == 1
    assert "model loading failed" not in log  # (that is the line of a load failure's traceback)
