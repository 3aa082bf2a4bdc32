"""Client secrets, idempotency records and rate-limit buckets survive a SIGKILL and restart: they are
written behind the requests into the same database as the conversations (a real SQLite file)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import httpx

from tests.gateway_process import GatewayProcess, start_gateway
from tests.integration.conftest import MODEL
from tests.integration.realtime_client import RealtimeClient

KEY = "sk-durable-key"


def start(tmp: Path) -> GatewayProcess:
    return start_gateway("--api-keys", KEY, "--no-load-voice-models", "--rate-limit-rpm", "10",
                         "--data-dir", str(tmp / "data"), log_path=tmp / f"gateway-{time.monotonic_ns()}.log")


async def _opens_a_session(gateway: GatewayProcess, secret: str) -> str:
    """session.created, or the error's code."""
    client = await RealtimeClient.connect(f"{gateway.ws_url}/v1/realtime", headers={"authorization": f"Bearer {secret}"})
    try:
        event = await client.recv()
        return event["type"] if event["type"] != "error" else event["error"]["code"]
    finally:
        await client.close()


async def test_secrets_idempotency_and_rate_limits_survive_a_restart(tmp_path: Path) -> None:
    gateway = start(tmp_path)
    headers = {"authorization": f"Bearer {KEY}"}
    body = {"model": MODEL, "max_tokens": 6, "temperature": 0, "messages": [{"role": "user", "content": "Hi"}]}
    try:
        with httpx.Client(base_url=gateway.url, headers=headers, timeout=60) as http:
            minted = [http.post("/v1/realtime/client_secrets", json={"session": {"type": "realtime"}}).json()["value"]
                      for _ in range(2)]
            first = http.post("/v1/chat/completions", json=body, headers={"idempotency-key": "order-1"})
            assert first.status_code == 200
            remaining = int(first.headers["x-ratelimit-remaining-requests"])
        assert await _opens_a_session(gateway, minted[0]) == "session.created"  # spends it
        time.sleep(0.6)  # past the journal's flush interval
        assert gateway.process is not None
        os.kill(gateway.process.pid, signal.SIGKILL)
        gateway.process.wait(10)
    except BaseException:
        gateway.stop()
        raise

    restarted = start(tmp_path)
    try:
        with httpx.Client(base_url=restarted.url, headers=headers, timeout=60) as http:
            again = http.post("/v1/chat/completions", json=body, headers={"idempotency-key": "order-1"})
            assert again.headers.get("idempotent-replayed") == "true" and again.json() == first.json()
            # The bucket was not refilled by the restart (one request per 6 s trickles back in).
            after = http.post("/v1/chat/completions", json=body)
            assert int(after.headers["x-ratelimit-remaining-requests"]) <= remaining
        assert await _opens_a_session(restarted, minted[1]) == "session.created", "an unspent secret still opens one"
        assert await _opens_a_session(restarted, minted[0]) == "invalid_api_key", "a spent secret stays spent"
    finally:
        restarted.stop()
