"""Chat Completions through the official openai SDK and raw HTTP, against the real model."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import openai
import pytest

from tests.gateway_process import GatewayProcess
from tests.integration.conftest import MODEL, RESUME_WINDOW_S

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture
def client(gateway: GatewayProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="unused", max_retries=0)


def greedy_answer(client: openai.OpenAI, max_tokens: int = 40) -> str:
    """The served model's greedy answer to QUESTION, not streamed: whatever its words, the same every time."""
    completion = client.chat.completions.create(model=MODEL, messages=QUESTION, temperature=0, max_tokens=max_tokens)
    return completion.choices[0].message.content or ""


def test_sdk_not_streamed(client: openai.OpenAI) -> None:
    completion = client.chat.completions.create(model=MODEL, messages=QUESTION, temperature=0, max_tokens=40)
    assert (completion.choices[0].message.content or "").strip()
    assert completion.choices[0].finish_reason == "stop"
    assert completion.usage is not None and completion.usage.prompt_tokens > 10
    assert completion.usage.completion_tokens > 0


def test_sdk_streamed_with_usage(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model=MODEL, messages=QUESTION, temperature=0, max_tokens=40, stream=True, stream_options={"include_usage": True}
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text.strip() and text == greedy_answer(client)  # streamed, the same answer
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["stop"]


def test_models_endpoint(client: openai.OpenAI) -> None:
    assert [model.id for model in client.models.list()] == [MODEL]
    assert client.models.retrieve(MODEL).id == MODEL
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-17")


def test_max_tokens_stop_and_seed(client: openai.OpenAI) -> None:
    short = client.chat.completions.create(model=MODEL, messages=QUESTION, temperature=0, max_tokens=2)
    assert short.choices[0].finish_reason == "length" and short.usage.completion_tokens == 2
    # A stop string cuts the answer just before it: one of the answer's own later words, whatever they are.
    full = greedy_answer(client)
    stop = full.split()[len(full.split()) // 2]
    cut = full.index(stop)
    assert cut > 0, (full, stop)
    stopped = client.chat.completions.create(model=MODEL, messages=QUESTION, temperature=0, max_tokens=40, stop=[stop])
    assert stopped.choices[0].finish_reason == "stop" and stopped.choices[0].message.content == full[:cut], (full, stop)
    story = [{"role": "user", "content": "Write one sentence about a cat."}]
    first, second = (
        client.chat.completions.create(model=MODEL, messages=story, temperature=1.0, seed=7, max_tokens=20) for _ in range(2)
    )
    assert first.choices[0].message.content == second.choices[0].message.content


def test_request_id_is_echoed(gateway: GatewayProcess) -> None:
    response = httpx.get(f"{gateway.url}/v1/models", headers={"x-request-id": "abc-123"})
    assert response.headers["x-request-id"] == "abc-123"
    assert httpx.get(f"{gateway.url}/v1/models").headers["x-request-id"].startswith("req_")


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        ("not json", 400, "invalid_json"),
        ("[1, 2]", 400, "invalid_request"),
        ('{"model": "smollm2-135m-instruct"}', 400, "missing_required_parameter"),
        ('{"model": "smollm2-135m-instruct", "messages": []}', 400, "invalid_value"),
        ('{"model": "smollm2-135m-instruct", "messages": [{"role": "user", "content": ""}]}', 400, "invalid_value"),
        ('{"model": "smollm2-135m-instruct", "messages": [{"role": "user", "content": 5}]}', 400, "invalid_type"),
        ('{"model": "smollm2-135m-instruct", "messages": [{"role": "user", "content": "hi"}], "n": 2}', 400, "invalid_value"),
        ('{"model": "smollm2-135m-instruct", "messages": [{"role": "user", "content": "hi"}], "temperature": 9}', 400, "invalid_value"),
        ('{"model": "gpt-17", "messages": [{"role": "user", "content": "hi"}]}', 404, "model_not_found"),
    ],
)
def test_bad_requests_get_openai_errors(gateway: GatewayProcess, body: str, status: int, code: str) -> None:
    response = httpx.post(f"{gateway.url}/v1/chat/completions", content=body, headers={"content-type": "application/json"})
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["code"] == code and error["message"] and "type" in error and "param" in error


def test_body_over_the_cap_is_413(gateway: GatewayProcess) -> None:
    body = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "x" * (5 * 1024 * 1024)}]})
    response = httpx.post(f"{gateway.url}/v1/chat/completions", content=body, headers={"content-type": "application/json"})
    assert response.status_code == 413 and response.json()["error"]["code"] == "request_too_large"


def test_idempotency_key_replays_the_first_answer(gateway: GatewayProcess) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Say a random word."}], "temperature": 1.5, "max_tokens": 8}
    headers = {"idempotency-key": "key-1"}
    first = httpx.post(f"{gateway.url}/v1/chat/completions", json=body, headers=headers, timeout=60)
    second = httpx.post(f"{gateway.url}/v1/chat/completions", json=body, headers=headers, timeout=60)
    assert first.status_code == second.status_code == 200
    assert first.json() == second.json()
    assert second.headers.get("idempotent-replayed") == "true"
    other = httpx.post(f"{gateway.url}/v1/chat/completions", json={**body, "max_tokens": 9}, headers=headers)
    assert other.status_code == 422 and other.json()["error"]["code"] == "idempotency_key_reused"


async def test_a_stream_its_client_left_is_cancelled_after_the_resume_window(gateway: GatewayProcess) -> None:
    # Greedy counting runs to max_tokens (several seconds); a sampled story sometimes ended before the window did.
    body = {"model": MODEL, "messages": [{"role": "user", "content": "List the numbers from 1 to 5000 separated by "
                                          "commas."}], "max_tokens": 2000, "temperature": 0, "stream": True}
    async with httpx.AsyncClient(base_url=gateway.url, timeout=60) as http:
        async with http.stream("POST", "/v1/chat/completions", json=body,
                               headers={"x-request-id": "req-left-for-good"}) as response:
            received = 0
            async for line in response.aiter_lines():
                received += line.startswith("data:")
                if received >= 5:
                    break
        # It goes on generating for the resume window, then the engine frees the request's slot.
        left = time.monotonic()
        for _ in range(100):
            metrics = (await http.get("/metrics")).text
            if "gateway_engine_active 0.0" in metrics:
                break
            await asyncio.sleep(0.1)
        assert "gateway_engine_active 0.0" in metrics
        assert time.monotonic() - left > RESUME_WINDOW_S - 0.5, "cancelled only when nobody came back"
        cancelled = [line for line in metrics.splitlines() if line.startswith("gateway_engine_requests_cancelled ")]
        assert float(cancelled[0].split()[1]) >= 1
    assert (await completion_record(gateway, "req-left-for-good"))["status"] == "client_left"


async def completion_record(gateway: GatewayProcess, request_id: str) -> dict:
    """The chat.completion log record of a request, once it is written."""
    for _ in range(100):
        for line in gateway.log_path.read_text(errors="replace").splitlines():
            if '"chat.completion"' in line and request_id in line:
                record = json.loads(line)
                if record.get("event") == "chat.completion" and record.get("request_id") == request_id:
                    return record
        await asyncio.sleep(0.1)
    raise AssertionError(f"no chat.completion record for {request_id}")


async def test_a_stream_its_client_left_is_logged_client_left_not_completed(gateway: GatewayProcess) -> None:
    """It runs to its end within the resume window with nobody reading: client_left. Read to its end: completed."""
    body = {"model": MODEL, "messages": QUESTION, "max_tokens": 30, "temperature": 0, "stream": True}
    async with httpx.AsyncClient(base_url=gateway.url, timeout=60) as http:
        async with http.stream("POST", "/v1/chat/completions", json=body,
                               headers={"x-request-id": "req-client-left"}) as response:
            await _sse_events(response, limit=3)
        async with http.stream("POST", "/v1/chat/completions", json=body,
                               headers={"x-request-id": "req-read-to-the-end"}) as response:
            assert (await _sse_events(response))[-1][1] == "[DONE]"
    left = await completion_record(gateway, "req-client-left")
    assert left["status"] == "client_left" and left["output_tokens"] >= 1, left
    assert (await completion_record(gateway, "req-read-to-the-end"))["status"] == "completed"


async def _sse_events(response: httpx.Response, limit: int | None = None) -> list[tuple[str, str]]:
    """(id, data) of each event, up to `limit`."""
    events, event_id = [], ""
    async for line in response.aiter_lines():
        if line.startswith("id: "):
            event_id = line[4:]
        elif line.startswith("data: "):
            events.append((event_id, line[6:]))
            if limit is not None and len(events) == limit:
                break
    return events


def _content(events: list[tuple[str, str]]) -> str:
    chunks = [json.loads(data) for _, data in events if data != "[DONE]"]
    return "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c.get("choices"))


async def test_a_dropped_stream_resumes_with_last_event_id(gateway: GatewayProcess) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Tell me a long story about a cat."}],
            "max_tokens": 150, "temperature": 0, "stream": True}
    async with httpx.AsyncClient(base_url=gateway.url, timeout=60) as http:
        async with http.stream("POST", "/v1/chat/completions", json=body) as response:
            before = await _sse_events(response, limit=4)
        stream_id = before[0][0].split("/")[0]
        assert [event_id for event_id, _ in before] == [f"{stream_id}/{n}" for n in range(1, 5)]
        await asyncio.sleep(0.3)
        async with http.stream("POST", "/v1/chat/completions", json=body,
                               headers={"last-event-id": before[-1][0]}) as response:
            assert response.status_code == 200
            after = await _sse_events(response)
        ids = [event_id for event_id, _ in before + after]
        assert ids == [f"{stream_id}/{n}" for n in range(1, len(ids) + 1)], "no duplicates and no gaps"
        assert after[-1][1] == "[DONE]"
        # Recently finished streams can still be read from any event on: at once, within the resume window (after
        # the plain request below, on a loaded machine the window had passed).
        async with http.stream("POST", "/v1/chat/completions", json=body,
                               headers={"last-event-id": f"{stream_id}/2"}) as response:
            assert [event_id for event_id, _ in await _sse_events(response)] == ids[2:]
        for last_event_id, status, code in ((f"{stream_id}/999", 400, "invalid_value"),
                                             ("chatcmpl-unknown/1", 404, "stream_not_found")):
            refused = await http.post("/v1/chat/completions", json=body, headers={"last-event-id": last_event_id})
            assert (refused.status_code, refused.json()["error"]["code"]) == (status, code)
        # Not run again: the same stream, which a plain request with the same body reproduces.
        complete = await http.post("/v1/chat/completions", json={**body, "stream": False})
        assert _content(before + after) == complete.json()["choices"][0]["message"]["content"]


async def test_a_last_event_id_resumes_only_the_request_that_started_its_stream(gateway: GatewayProcess,
                                                                                client: openai.OpenAI) -> None:
    """Another prompt sent with a stream's Last-Event-ID is refused (422, as a reused Idempotency-Key with
    another body), not answered with that stream's reply; the same request, spaced or ordered otherwise, resumes."""
    body = {"model": MODEL, "messages": QUESTION, "max_tokens": 40, "temperature": 0, "stream": True}
    async with httpx.AsyncClient(base_url=gateway.url, timeout=60) as http:
        async with http.stream("POST", "/v1/chat/completions", json=body) as response:
            before = await _sse_events(response, limit=3)
        last_event_id = before[-1][0]
        other = [{"role": "user", "content": "Name a colour."}]
        with pytest.raises(openai.UnprocessableEntityError) as refused:
            client.chat.completions.create(model=MODEL, messages=other, max_tokens=40, temperature=0, stream=True,
                                           extra_headers={"Last-Event-ID": last_event_id})
        assert refused.value.body == {"message": refused.value.body["message"], "type": "invalid_request_error",
                                      "param": "Last-Event-ID", "code": "last_event_id_reused"}
        for changed in ({**body, "max_tokens": 41}, {**body, "stream": False}, {key: body[key] for key in body if key != "temperature"}):
            answer = await http.post("/v1/chat/completions", json=changed, headers={"last-event-id": last_event_id})
            assert answer.status_code == 422 and answer.json()["error"]["code"] == "last_event_id_reused", answer.text
        reordered = json.dumps(dict(reversed(list(body.items()))), indent=1)
        async with http.stream("POST", "/v1/chat/completions", content=reordered,
                               headers={"last-event-id": last_event_id, "content-type": "application/json"}) as response:
            assert response.status_code == 200
            after = await _sse_events(response)
    assert after[-1][1] == "[DONE]" and _content(before + after) == greedy_answer(client)


def test_openai_model_names_reach_the_served_model(client: openai.OpenAI, gateway: GatewayProcess) -> None:
    """An app written for OpenAI changes only its base URL: OpenAI's chat and realtime names are aliases
    (--answer-to-openai-model-names, on by default); other names stay 404 model_not_found."""
    completion = client.chat.completions.create(model="gpt-4o-mini", messages=QUESTION, temperature=0, max_tokens=40)
    assert completion.model == "gpt-4o-mini"
    assert (completion.choices[0].message.content or "") == greedy_answer(client)  # the served model's answer
    assert client.models.retrieve("gpt-realtime").id == "gpt-realtime"
    assert [m.id for m in client.models.list()] == [MODEL]  # the aliases answer but are not listed
    with pytest.raises(openai.NotFoundError) as caught:
        client.chat.completions.create(model="no-such-model", messages=QUESTION, max_tokens=4)
    assert caught.value.body["code"] == "model_not_found"
