"""Client secrets, idempotency records and rate-limit buckets survive a SIGKILL and restart, in the same
database as the conversations: a real SQLite file, and a real PostgreSQL server when one is installed.
The kill comes right after a secret is spent and an idempotent request is answered: those answers wait
for their commit, so nothing the client was told is lost."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import httpx
import pytest

from tests.gateway_process import GatewayProcess, start_gateway
from tests.integration.conftest import MODEL
from tests.integration.postgres_server import postgres_url  # noqa: F401 (a fixture, used by name)
from tests.integration.realtime_client import RealtimeClient

KEY = "sk-durable-key"


@pytest.fixture(params=["sqlite", "postgresql"])
def database_args(request: pytest.FixtureRequest, tmp_path: Path) -> list[str]:
    if request.param == "sqlite":
        return ["--data-dir", str(tmp_path / "data")]
    return ["--database-url", request.getfixturevalue("postgres_url")]


def start(tmp: Path, database_args: list[str]) -> GatewayProcess:
    return start_gateway("--api-keys", KEY, "--no-load-voice-models", "--rate-limit-rpm", "10", *database_args,
                         log_path=tmp / f"gateway-{time.monotonic_ns()}.log")


async def _opens_a_session(gateway: GatewayProcess, secret: str) -> str:
    """session.created, or the error's code."""
    client = await RealtimeClient.connect(f"{gateway.ws_url}/v1/realtime", headers={"authorization": f"Bearer {secret}"})
    try:
        event = await client.recv()
        return event["type"] if event["type"] != "error" else event["error"]["code"]
    finally:
        await client.close()


async def test_secrets_idempotency_and_rate_limits_survive_a_restart(tmp_path: Path, database_args: list[str]) -> None:
    gateway = start(tmp_path, database_args)
    headers = {"authorization": f"Bearer {KEY}"}
    body = {"model": MODEL, "max_tokens": 1, "temperature": 0, "messages": [{"role": "user", "content": "Hi"}]}
    try:
        async with httpx.AsyncClient(base_url=gateway.url, headers=headers, timeout=60) as http:
            minted = [(await http.post("/v1/realtime/client_secrets", json={"session": {"type": "realtime"}}))
                      .json()["value"] for _ in range(2)]
            first = await http.post("/v1/chat/completions", json=body, headers={"idempotency-key": "order-1"})
            session = await RealtimeClient.connect(f"{gateway.ws_url}/v1/realtime",
                                                   headers={"authorization": f"Bearer {minted[0]}"})
            assert (await session.recv())["type"] == "session.created"  # it spent the secret
            # Killed at once, a few ms after both answers: well inside a write-behind interval.
            assert gateway.process is not None
            os.kill(gateway.process.pid, signal.SIGKILL)
            await session.close()
        assert first.status_code == 200
        remaining = int(first.headers["x-ratelimit-remaining-requests"])
        gateway.process.wait(10)
    except BaseException:
        gateway.stop()
        raise

    restarted = start(tmp_path, database_args)
    try:
        with httpx.Client(base_url=restarted.url, headers=headers, timeout=60) as http:
            again = http.post("/v1/chat/completions", json=body, headers={"idempotency-key": "order-1"})
            assert again.headers.get("idempotent-replayed") == "true" and again.json() == first.json()
            # The bucket was not refilled by the restart (one request per 6 s trickles back in).
            after = http.post("/v1/chat/completions", json=body)
            assert int(after.headers["x-ratelimit-remaining-requests"]) <= remaining
        assert await _opens_a_session(restarted, minted[0]) == "invalid_api_key", "a spent secret stays spent"
        assert await _opens_a_session(restarted, minted[1]) == "session.created", "an unspent secret still opens one"
    finally:
        restarted.stop()
