"""Tokens per minute per key (--rate-limit-tpm): OpenAI's x-ratelimit-*-tokens headers, the 429 and its headers,
a reservation given back, Realtime rate_limits.updated events; in this process and in Redis. And a Realtime
session's bounds in time: its longest duration and its idle timeout."""

from __future__ import annotations

import asyncio
import shutil
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
import websockets

from gateway.platform.cluster import RedisServer
from tests.gateway_process import GatewayProcess, start_gateway
from tests.integration.conftest import MODEL
from tests.integration.realtime_client import RealtimeClient

TPM = 600
KEYS = ("sk-quota-one", "sk-quota-two", "sk-quota-three")  # the third: the Responses API's own bucket


@pytest.fixture(scope="module", params=["memory", "redis"])
def quota_gateway(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    folder = tmp_path_factory.mktemp(f"quota-{request.param}")
    redis = None
    extra: list[str] = []
    if request.param == "redis":
        if not shutil.which("redis-server"):
            pytest.skip("needs redis-server")
        redis = RedisServer(folder / "redis").start()
        extra = ["--redis-url", redis.url]
    process = start_gateway("--api-keys", ",".join(KEYS), "--rate-limit-tpm", str(TPM), "--no-load-voice-models",
                            "--data-dir", str(folder / "data"), *extra, log_path=folder / "gateway.log")
    yield process
    process.stop()
    if redis is not None:
        redis.stop()


def chat(process: GatewayProcess, key: str, max_tokens: int, text: str = "Say hi.") -> httpx.Response:
    return httpx.post(f"{process.url}/v1/chat/completions", headers={"authorization": f"Bearer {key}"}, timeout=120,
                      json={"model": MODEL, "max_tokens": max_tokens, "temperature": 0,
                            "messages": [{"role": "user", "content": text}]})


def remaining(response: httpx.Response) -> int:
    return int(response.headers["x-ratelimit-remaining-tokens"])


def seconds(value: str) -> float:
    assert value.endswith("s") and not value.endswith("ms")
    return float(value[:-1])


def test_headers_reserve_and_give_back(quota_gateway: GatewayProcess) -> None:
    key = KEYS[0]
    started = time.monotonic()  # the bucket refills from the first's reservation on, however slow its reply
    first = chat(quota_gateway, key, 60)
    assert first.status_code == 200
    usage = first.json()["usage"]
    assert first.headers["x-ratelimit-limit-tokens"] == str(TPM)
    # Reserved: the prompt plus max_tokens (a full bucket, refilled by at most the request's own time).
    assert TPM - usage["prompt_tokens"] - 60 - 1 <= remaining(first) <= TPM - usage["prompt_tokens"] - 60 + 10
    assert 0 < seconds(first.headers["x-ratelimit-reset-tokens"]) <= 60
    second = chat(quota_gateway, key, 60)
    # What the first did not generate came back: the second starts from the first's actual use.
    refill = (time.monotonic() - started + 2) * TPM / 60
    expected = remaining(first) + (60 - usage["completion_tokens"]) - second.json()["usage"]["prompt_tokens"] - 60
    assert expected - 1 <= remaining(second) <= expected + refill


def test_429_when_the_tokens_run_out_and_other_keys_go_on(quota_gateway: GatewayProcess) -> None:
    key = KEYS[1]
    too_large = chat(quota_gateway, key, TPM)
    assert too_large.status_code == 429 and too_large.json()["error"]["type"] == "tokens"
    assert "Request too large" in too_large.json()["error"]["message"]
    # Twelve at once, about 100 tokens reserved each out of 600: the reservations are taken as the requests
    # arrive, so the bucket runs out however slowly the replies come (one after another, on a loaded machine
    # the bucket refilled as fast as slow replies drew on it).
    with ThreadPoolExecutor(12) as pool:
        answers = list(pool.map(lambda _: chat(quota_gateway, key, 80, "Count from one to fifty."), range(12)))
    assert {answer.status_code for answer in answers} == {200, 429}, [answer.status_code for answer in answers]
    cost = next(a for a in answers if a.status_code == 200).json()["usage"]["prompt_tokens"] + 80  # its reservation
    refused = next(answer for answer in answers if answer.status_code == 429)
    error = refused.json()["error"]
    assert error["code"] == "rate_limit_exceeded" and error["type"] == "tokens"
    assert refused.headers["x-ratelimit-limit-tokens"] == str(TPM)
    left = remaining(refused)
    assert 0 <= left < cost  # refused because what is left cannot cover it
    wait = seconds(refused.headers["x-ratelimit-reset-tokens"])
    assert 0 < wait <= cost * 60 / TPM and int(refused.headers["retry-after"]) >= 1  # until the refill covers it
    assert chat(quota_gateway, KEYS[0], 8).status_code == 200  # another key's bucket is its own
    time.sleep(wait + 0.5)
    assert chat(quota_gateway, key, 80, "Count from one to fifty.").status_code == 200


def test_completions_responses_and_conversation_messages_draw_on_the_same_tokens(
        quota_gateway: GatewayProcess) -> None:
    key = KEYS[0]
    headers = {"authorization": f"Bearer {key}"}
    url = quota_gateway.url

    def completion(max_tokens: int) -> httpx.Response:
        return httpx.post(f"{url}/v1/completions", headers=headers, timeout=120,
                          json={"model": MODEL, "prompt": "Once upon a time", "max_tokens": max_tokens})

    assert completion(TPM).status_code == 429 and "Request too large" in completion(TPM).json()["error"]["message"]
    before = remaining(chat(quota_gateway, key, 1))
    answer = completion(50)
    assert answer.status_code == 200 and answer.headers["x-ratelimit-limit-tokens"] == str(TPM)
    # Reserved: its prompt plus max_tokens, from what the chat left (refilled by at most a few seconds meanwhile).
    assert remaining(answer) <= before - answer.json()["usage"]["prompt_tokens"] - 50 + 30

    conversation = httpx.post(f"{url}/backend-api/conversations", headers=headers, json={}).json()["id"]
    message_url = f"{url}/backend-api/conversation/{conversation}/messages"
    too_large = httpx.post(message_url, headers=headers, timeout=120, json={"model": MODEL, "content": "Hi.",
                                                                            "max_tokens": TPM})
    assert too_large.status_code == 429 and too_large.json()["error"]["type"] == "tokens"
    streamed = httpx.post(message_url, headers=headers, timeout=120, json={"model": MODEL, "content": "Hi.",
                                                                           "max_tokens": 8})
    assert streamed.status_code == 200 and 0 <= remaining(streamed) < TPM - 8

    responses_key = {"authorization": f"Bearer {KEYS[2]}"}  # a full bucket: the Realtime test after this reads KEYS[0]'s

    def response(max_output_tokens: int) -> httpx.Response:
        return httpx.post(f"{url}/v1/responses", headers=responses_key, timeout=120,
                          json={"model": MODEL, "input": "Say hi.", "max_output_tokens": max_output_tokens})

    too_large = response(TPM)
    assert too_large.status_code == 429 and too_large.json()["error"]["type"] == "tokens"
    before = remaining(chat(quota_gateway, KEYS[2], 1))
    answered = response(40)
    assert answered.status_code == 200 and answered.headers["x-ratelimit-limit-tokens"] == str(TPM)
    assert remaining(answered) <= before - answered.json()["usage"]["input_tokens"] - 40 + 30


async def test_realtime_rate_limits_updated(quota_gateway: GatewayProcess) -> None:
    client = await RealtimeClient.connect(f"{quota_gateway.ws_url}/v1/realtime?model={MODEL}",
                                          headers={"authorization": f"Bearer {KEYS[0]}"})
    await client.wait_for("session.created")
    await client.send({"type": "session.update", "session": {"type": "realtime", "output_modalities": ["text"]}})
    updates: list[dict[str, Any]] = []
    for _ in range(2):
        done = await client.ask("Say hi.", max_output_tokens=40)
        assert done["response"]["status"] in ("completed", "incomplete")
        updates.append(client.of_type("rate_limits.updated")[-1])  # validated against the SDK's type
    first, second = (update["rate_limits"][0] for update in updates)
    assert first["name"] == "tokens" and first["limit"] == TPM and 0 <= first["remaining"] < TPM - 40
    assert first["reset_seconds"] > 0
    # Sent at the response's start: after response.created, before its text.
    types = [event["type"] for event in client.events]
    at = types.index("rate_limits.updated")
    assert types.index("response.created") < at < types.index("response.output_text.delta")
    assert second["remaining"] != first["remaining"]
    # A response the bucket can never cover fails, and says why; the session goes on.
    refused = await client.ask("Say hi.", max_output_tokens=TPM)
    assert refused["response"]["status"] == "failed"
    assert refused["response"]["status_details"]["error"]["code"] == "rate_limit_exceeded"
    assert client.of_type("error")[-1]["error"]["code"] == "rate_limit_exceeded"
    assert (await client.ask("Say hi.", max_output_tokens=8))["response"]["status"] in ("completed", "incomplete")
    await client.close()


@pytest.fixture(scope="module")
def short_sessions(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    folder = tmp_path_factory.mktemp("short-sessions")
    process = start_gateway("--max-session-duration-s", "4", "--session-idle-timeout-s", "2", "--no-load-voice-models",
                            log_path=folder / "gateway.log")
    yield process
    process.stop()


async def test_an_idle_session_ends(short_sessions: GatewayProcess) -> None:
    client = await RealtimeClient.connect(f"{short_sessions.ws_url}/v1/realtime?model={MODEL}")
    created = await client.wait_for("session.created")
    assert created["session"]["expires_at"] - time.time() <= 5
    error = await client.wait_for("error", timeout=10)
    assert error["error"]["code"] == "session_idle_timeout"
    assert 1.5 <= error["_received_at"] - created["_received_at"] <= 5
    with pytest.raises(websockets.ConnectionClosedOK):
        await client.recv(timeout=5)


async def test_a_session_ends_at_its_longest_duration_however_busy(short_sessions: GatewayProcess) -> None:
    client = await RealtimeClient.connect(f"{short_sessions.ws_url}/v1/realtime?model={MODEL}")
    created = await client.wait_for("session.created")

    async def keep_busy() -> None:
        while True:
            await client.send({"type": "session.update", "session": {"type": "realtime", "instructions": "Be brief."}})
            await asyncio.sleep(0.5)

    busy = asyncio.create_task(keep_busy())
    try:
        error = await client.wait_for("error", timeout=10)
    finally:
        busy.cancel()
        await asyncio.gather(busy, return_exceptions=True)
    assert error["error"]["code"] == "session_expired"
    assert 3.5 <= error["_received_at"] - created["_received_at"] <= 7
    with pytest.raises(websockets.ConnectionClosedOK):
        while True:
            await client.recv(timeout=5)
