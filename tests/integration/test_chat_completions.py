"""Chat Completions through the official openai SDK and raw HTTP, against the real model."""

from __future__ import annotations

import asyncio
import json

import httpx
import openai
import pytest

from tests.gateway_process import GatewayProcess
from tests.integration.conftest import MODEL

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture
def client(gateway: GatewayProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="unused", max_retries=0)


def test_sdk_not_streamed(client: openai.OpenAI) -> None:
    completion = client.chat.completions.create(model=MODEL, messages=QUESTION, temperature=0, max_tokens=40)
    assert "Paris" in completion.choices[0].message.content
    assert completion.choices[0].finish_reason == "stop"
    assert completion.usage is not None and completion.usage.prompt_tokens > 10
    assert completion.usage.completion_tokens > 0


def test_sdk_streamed_with_usage(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model=MODEL, messages=QUESTION, temperature=0, max_tokens=40, stream=True, stream_options={"include_usage": True}
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert "Paris" in text
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
    stopped = client.chat.completions.create(model=MODEL, messages=QUESTION, temperature=0, max_tokens=40, stop=["Paris"])
    assert "Paris" not in stopped.choices[0].message.content
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


async def test_client_disconnect_cancels_the_stream(gateway: GatewayProcess) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Tell me a very long story."}], "max_tokens": 400, "stream": True}
    async with httpx.AsyncClient(base_url=gateway.url, timeout=60) as http:
        async with http.stream("POST", "/v1/chat/completions", json=body) as response:
            received = 0
            async for line in response.aiter_lines():
                received += line.startswith("data:")
                if received >= 5:
                    break
        # The engine frees the request's slot once the connection is gone.
        for _ in range(40):
            metrics = (await http.get("/metrics")).text
            if "gateway_engine_active 0.0" in metrics:
                break
            await asyncio.sleep(0.1)
        assert "gateway_engine_active 0.0" in metrics
        cancelled = [line for line in metrics.splitlines() if line.startswith("gateway_engine_requests_cancelled ")]
        assert float(cancelled[0].split()[1]) >= 1


def test_openai_model_names_reach_the_served_model(client: openai.OpenAI, gateway: GatewayProcess) -> None:
    """An app written for OpenAI changes only its base URL: OpenAI's chat and realtime names are aliases
    (--answer-to-openai-model-names, on by default); other names stay 404 model_not_found."""
    completion = client.chat.completions.create(model="gpt-4o-mini", messages=QUESTION, temperature=0, max_tokens=40)
    assert "Paris" in (completion.choices[0].message.content or "") and completion.model == "gpt-4o-mini"
    assert client.models.retrieve("gpt-realtime").id == "gpt-realtime"
    assert [m.id for m in client.models.list()] == [MODEL]  # the aliases answer but are not listed
    with pytest.raises(openai.NotFoundError) as caught:
        client.chat.completions.create(model="no-such-model", messages=QUESTION, max_tokens=4)
    assert caught.value.body["code"] == "model_not_found"
