"""Session admission across replicas (issue 28, defect 8): --max-sessions-per-key counts a key's sessions on
every replica that shares Redis, and a refused WebSocket gets an HTTP answer before the upgrade (429, or 503
with Retry-After, which a router retries elsewhere), not a 101 and a 1013 close. Two real gateways on one
real redis-server on loopback."""

from __future__ import annotations

import asyncio
import json
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import websockets

from gateway.platform.cluster import RedisServer
from tests.gateway_process import GatewayProcess, start_gateway
from tests.integration.conftest import MODEL
from tests.integration.realtime_client import RealtimeClient

pytestmark = pytest.mark.skipif(not shutil.which("redis-server"), reason="needs redis-server (Debian package)")

KEYS = [f"sk-seats-{name}" for name in ("one", "two", "three", "four")]
MAX_SESSIONS = 2  # on each replica


SEAT_TTL_S = 3.0  # --session-seat-ttl-s: short, so a crashed replica's seats lapse soon


def serve(folder: Path, redis: RedisServer) -> GatewayProcess:
    return start_gateway("--api-keys", ",".join(KEYS), "--max-sessions-per-key", "1", "--max-sessions",
                         str(MAX_SESSIONS), "--redis-url", redis.url, "--no-load-voice-models",
                         "--data-dir", str(folder / "data"), "--session-seat-ttl-s", str(SEAT_TTL_S),
                         log_path=folder / "gateway.log")


@pytest.fixture(scope="module")
def redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path_factory.mktemp("seats-redis")).start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def replicas(redis: RedisServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[GatewayProcess, GatewayProcess]]:
    first = serve(tmp_path_factory.mktemp("replica-a"), redis)
    try:
        second = serve(tmp_path_factory.mktemp("replica-b"), redis)
    except BaseException:
        first.stop()
        raise
    yield first, second
    second.stop()
    first.stop()


def url(replica: GatewayProcess) -> str:
    return f"{replica.ws_url}/v1/realtime?model={MODEL}"


async def open_session(replica: GatewayProcess, key: str) -> RealtimeClient:
    client = await RealtimeClient.connect(url(replica), headers={"authorization": f"Bearer {key}"})
    assert (await client.recv())["type"] == "session.created"
    return client


async def refused(replica: GatewayProcess, key: str) -> websockets.InvalidStatus:
    """The handshake's HTTP answer: the connection is never upgraded."""
    with pytest.raises(websockets.InvalidStatus) as caught:
        await websockets.connect(url(replica), additional_headers={"authorization": f"Bearer {key}"})
    return caught.value


def error_of(refusal: websockets.InvalidStatus) -> dict:
    return json.loads(refusal.response.body or b"{}")["error"]


async def opens_within(replica: GatewayProcess, key: str, timeout_s: float) -> tuple[RealtimeClient, float]:
    """A session opened as soon as the bounds let it, and how long that took."""
    started = time.monotonic()
    while True:
        try:
            return await open_session(replica, key), time.monotonic() - started
        except websockets.InvalidStatus:
            if time.monotonic() - started > timeout_s:
                raise
            await asyncio.sleep(0.2)


async def test_a_keys_cap_holds_across_replicas_and_frees_when_its_session_closes(
        replicas: tuple[GatewayProcess, GatewayProcess]) -> None:
    first, second = replicas
    held = await open_session(first, KEYS[0])
    refusal = await refused(second, KEYS[0])
    assert refusal.response.status_code == 429 and int(refusal.response.headers["retry-after"]) >= 1
    assert error_of(refusal)["code"] == "too_many_sessions" and error_of(refusal)["type"] == "rate_limit_error"
    assert (await refused(first, KEYS[0])).response.status_code == 429  # and on its own replica
    other = await open_session(second, KEYS[1])  # another key has room
    await other.close()

    await held.close()
    again, waited = await opens_within(second, KEYS[0], timeout_s=5)
    assert waited < 5, "the seat is given back when the session closes, not when it lapses"
    await again.close()


async def test_a_full_replica_answers_503_with_retry_after_before_the_upgrade(
        replicas: tuple[GatewayProcess, GatewayProcess]) -> None:
    first, second = replicas
    opened = [(await opens_within(second, key, timeout_s=5))[0] for key in KEYS[:MAX_SESSIONS]]
    try:
        refusal = await refused(second, KEYS[MAX_SESSIONS])
        assert refusal.response.status_code == 503 and int(refusal.response.headers["retry-after"]) >= 1
        assert error_of(refusal) == {**error_of(refusal), "code": "replica_full", "type": "server_error"}
        # What a router's retry-on-503 does: the other replica takes it.
        elsewhere = await open_session(first, KEYS[MAX_SESSIONS])
        await elsewhere.close()
    finally:
        for client in opened:
            await client.close()


async def test_a_crashed_replicas_seats_lapse(redis: RedisServer, replicas: tuple[GatewayProcess, GatewayProcess],
                                              tmp_path: Path) -> None:
    first, _ = replicas
    doomed = serve(tmp_path, redis)
    try:
        client = await open_session(doomed, KEYS[3])
        assert doomed.process is not None
        doomed.process.kill()  # SIGKILL: it never gives its seat back
        doomed.process.wait()
        assert (await refused(first, KEYS[3])).response.status_code == 429
        again, waited = await opens_within(first, KEYS[3], timeout_s=SEAT_TTL_S + 10)
        assert waited <= SEAT_TTL_S + 2  # its lapse, and the polling
        await again.close()
        await client.connection.close()
    finally:
        doomed.stop()
