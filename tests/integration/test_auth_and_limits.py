"""API keys, ephemeral client secrets and rate limits on a gateway started with --api-keys."""

from __future__ import annotations

import asyncio
import os

import httpx
import openai
import pytest
from openai.types.realtime import ClientSecretCreateResponse

from inference.llm import cpu_kernels
from tests.gateway_process import GatewayProcess
from tests.integration.conftest import API_KEY, MODEL
from tests.integration.realtime_client import RealtimeClient

BODY = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3}


def test_missing_or_wrong_key_is_401(secured_gateway: GatewayProcess) -> None:
    url = f"{secured_gateway.url}/v1/chat/completions"
    for headers in ({}, {"authorization": "Bearer sk-wrong"}, {"authorization": f"Basic {API_KEY}"}):
        response = httpx.post(url, json=BODY, headers=headers)
        assert response.status_code == 401
        assert response.json()["error"]["code"] == "invalid_api_key"
    client = openai.OpenAI(base_url=f"{secured_gateway.url}/v1", api_key="sk-wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        client.models.list()


def test_right_key_works_and_reports_rate_limit_headers(secured_gateway: GatewayProcess) -> None:
    response = httpx.post(
        f"{secured_gateway.url}/v1/chat/completions", json=BODY, headers={"authorization": f"Bearer {API_KEY}"}, timeout=60
    )
    assert response.status_code == 200
    assert response.headers["x-ratelimit-limit-requests"] == "30"
    assert int(response.headers["x-ratelimit-remaining-requests"]) < 30


async def test_websocket_needs_a_key(secured_gateway: GatewayProcess) -> None:
    client = await RealtimeClient.connect(f"{secured_gateway.ws_url}/v1/realtime")
    error = await client.recv()
    assert error["type"] == "error" and error["error"]["code"] == "invalid_api_key"
    await asyncio.wait_for(client.connection.wait_closed(), 5)
    client = await RealtimeClient.connect(f"{secured_gateway.ws_url}/v1/realtime", headers={"authorization": f"Bearer {API_KEY}"})
    assert (await client.recv())["type"] == "session.created"
    await client.close()


async def test_client_secret_opens_exactly_one_session_with_its_configuration(secured_gateway: GatewayProcess) -> None:
    url = f"{secured_gateway.url}/v1/realtime/client_secrets"
    assert httpx.post(url, json={}).status_code == 401
    minted = httpx.post(
        url,
        json={"session": {"type": "realtime", "instructions": "Speak like a pirate.", "output_modalities": ["text"]}},
        headers={"authorization": f"Bearer {API_KEY}"},
    )
    assert minted.status_code == 200, minted.text
    secret = minted.json()
    assert secret["value"].startswith("ek_") and secret["expires_at"] > 0
    assert secret["session"]["instructions"] == "Speak like a pirate."
    ClientSecretCreateResponse.model_validate(secret, strict=False)  # the SDK's type: session.id included
    # Browsers pass the key as a WebSocket subprotocol; a bearer header works too.
    client = await RealtimeClient.connect(
        f"{secured_gateway.ws_url}/v1/realtime", headers={"authorization": f"Bearer {secret['value']}"}
    )
    created = await client.recv()
    assert created["type"] == "session.created"
    assert created["session"]["instructions"] == "Speak like a pirate."
    assert created["session"]["id"] == secret["session"]["id"]  # the session the secret announced
    await client.close()
    reused = await RealtimeClient.connect(
        f"{secured_gateway.ws_url}/v1/realtime", headers={"authorization": f"Bearer {secret['value']}"}
    )
    assert (await reused.recv())["error"]["code"] == "invalid_api_key"
    await reused.close()
    # A bad session configuration fails when minting, not later in the browser.
    bad = httpx.post(url, json={"session": {"output_modalities": ["smell"]}}, headers={"authorization": f"Bearer {API_KEY}"})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "session.output_modalities[0]"


def test_context_overflow_is_a_clear_400(secured_gateway: GatewayProcess) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "apple " * 1500}], "max_tokens": 10}
    response = httpx.post(
        f"{secured_gateway.url}/v1/chat/completions", json=body, headers={"authorization": f"Bearer {API_KEY}"}, timeout=60
    )
    assert response.status_code == 400 and response.json()["error"]["code"] == "context_length_exceeded"


def test_long_history_is_trimmed_to_the_context_window(secured_gateway: GatewayProcess) -> None:
    client = openai.OpenAI(base_url=f"{secured_gateway.url}/v1", api_key=API_KEY, max_retries=0)
    messages = [{"role": "system", "content": "Answer in English."}]
    for index in range(8):
        messages += [{"role": "user", "content": f"Note {index}: " + "banana " * 100}, {"role": "assistant", "content": "Okay."}]
    messages += [{"role": "user", "content": "What is the capital of France?"}]
    completion = client.chat.completions.create(model=MODEL, messages=messages, temperature=0, max_tokens=30)
    # 8 x 100 words do not fit in 1024 tokens: the oldest turns went, the rest was answered.
    assert 500 < completion.usage.prompt_tokens <= 1024 - 30


async def test_a_full_engine_queue_answers_429_at_once(secured_gateway: GatewayProcess) -> None:
    body = {**BODY, "max_tokens": 60, "messages": [{"role": "user", "content": "Count to one hundred."}]}
    headers = {"authorization": f"Bearer {API_KEY}"}
    async with httpx.AsyncClient(base_url=secured_gateway.url, headers=headers, timeout=60) as http:
        responses = await asyncio.gather(*(http.post("/v1/chat/completions", json=body) for _ in range(4)))
    statuses = sorted(response.status_code for response in responses)
    # At most one request runs and one waits in the queue (the scheduler may not have admitted the
    # first when the second arrives); the others are refused without waiting.
    assert statuses in ([200, 200, 429, 429], [200, 429, 429, 429]), statuses
    refused = next(response for response in responses if response.status_code == 429)
    assert refused.json()["error"]["code"] == "server_overloaded"
    assert int(refused.headers["retry-after"]) >= 1


async def test_a_full_engine_queue_is_an_error_event_over_the_websocket(secured_gateway: GatewayProcess) -> None:
    headers = {"authorization": f"Bearer {API_KEY}"}
    clients = [await RealtimeClient.connect(f"{secured_gateway.ws_url}/v1/realtime", headers=headers) for _ in range(4)]
    try:
        for client in clients:
            await client.wait_for("session.created")
            await client.send(
                {"type": "conversation.item.create", "item": {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Count to fifty."}]}}
            )
        await asyncio.gather(*(client.send({"type": "response.create", "response": {"max_output_tokens": 60}}) for client in clients))
        done = await asyncio.gather(*(client.wait_for("response.done", timeout=90) for client in clients))
        failed = [client for client, event in zip(clients, done) if event["response"]["status"] == "failed"]
        assert 2 <= len(failed) <= 3, [event["response"]["status"] for event in done]
        assert all(client.of_type("error")[0]["error"]["code"] == "server_overloaded" for client in failed)
        # The session goes on: once the engine is free, the same client is answered.
        retry = await failed[0].ask("Say hello.", max_output_tokens=5)
        assert retry["response"]["status"] in ("completed", "incomplete")
    finally:
        for client in clients:
            await client.close()


def test_rate_limit_gives_429_with_retry_after(secured_gateway: GatewayProcess) -> None:
    headers = {"authorization": f"Bearer {API_KEY}"}
    statuses = []
    with httpx.Client(base_url=secured_gateway.url, headers=headers) as http:
        for _ in range(40):
            response = http.get("/v1/models")
            statuses.append(response.status_code)
            if response.status_code == 429:
                break
    assert statuses[-1] == 429
    assert response.json()["error"]["code"] == "rate_limit_exceeded"
    assert int(response.headers["retry-after"]) >= 1
    assert response.headers["x-ratelimit-remaining-requests"] == "0"


def test_healthz_said_503_while_loading_then_200(secured_gateway: GatewayProcess) -> None:
    assert secured_gateway.health_statuses == {503, 200}


def test_healthz_and_metrics_need_no_key(secured_gateway: GatewayProcess) -> None:
    health = httpx.get(f"{secured_gateway.url}/healthz").json()
    assert health["status"] == "ready" and health["voice"] is False
    # The embedded GGUF runs its own types on a CPU (Q4_1 layers as 4-bit groups, its Q8_0 head as 8-bit ones), on
    # the fastest build of the engine's kernels this machine runs (or the one the run asked for:
    # GATEWAY_LLM_KERNELS=avx2 plays an AVX2-only host on an AVX512 one): every part of a step on it, and the
    # report says so. Without the engine's kernels the Q4_1 layers run as int4 on torch's.
    isas = cpu_kernels.supported_isas()
    asked = os.environ.get("GATEWAY_LLM_KERNELS", "auto")
    best = (isas[0] if isas else "torch") if asked == "auto" else asked
    own = best != "torch"
    expected = {"backend": "in-process", "device": "cpu", "cpu_isas": ",".join(isas) or "none", "kernels": best,
                "weights": "gguf" if own else "int4", "matmul": best, "attention": best if own else "sdpa",
                "head": best if own else "onednn", "layers_in_one_call": str(own).lower(),
                "decode": "eager"}  # CUDA graphs only on a GPU
    if own:
        expected |= {f"gguf_{part}": "Q4_1 as 4-bit groups" for part in ("qkv", "o", "gate_up", "down")}
        expected["gguf_head"] = "Q8_0 as 8-bit groups"
    assert health["llm"] == expected
    assert "gateway_http_requests_total" in httpx.get(f"{secured_gateway.url}/metrics").text
