"""Two gateway replicas, one LLM worker, Redis, PostgreSQL (SQLite when it is not installed) and HAProxy
routers, started by `gateway cluster`'s own launcher on loopback (issue 18).

What must hold across replicas: a client secret minted on one opens one session on the other, once; an
idempotent retry on the other replica replays; a rate limit is one bucket for both; a hangup, a sideband or a
resume that reaches the wrong replica reaches the owner, for a Realtime call and a GPT-Live session alike; a
replica drained mid-conversation hands its session off, and the client goes on on the other one with the
conversation intact."""

from __future__ import annotations

import asyncio
import json
import shutil
from collections.abc import Iterator

import httpx
import pytest
import websockets
from aiortc import RTCSessionDescription

from gateway.platform.cluster import Cluster
from tests.integration.conftest import MODEL
from tests.integration.live_client import LiveCaller
from tests.integration.realtime_client import RealtimeClient
from tests.integration.test_http_hardening import make_offer

pytestmark = pytest.mark.skipif(not (shutil.which("redis-server") and shutil.which("haproxy")),
                                reason="needs redis-server and haproxy (Debian packages; .ci/run installs them)")

KEYS = {name: f"sk-{name}" for name in ("secrets", "idempotency", "rate", "call", "live", "resume", "drain")}
RATE_PER_MINUTE = 30
TEXT_ONLY = {"type": "session.update", "session": {"output_modalities": ["text"], "temperature": 0, "max_output_tokens": 30}}


def bearer(name: str) -> dict[str, str]:
    return {"authorization": f"Bearer {KEYS[name]}"}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with Cluster(tmp_path_factory.mktemp("cluster"), replicas=2, workers=1, voice=True,
                 replica_args=["--api-keys", ",".join(KEYS.values()), "--rate-limit-rpm", str(RATE_PER_MINUTE),
                               "--drain-timeout-s", "10"]) as running:
        yield running


def replica_urls(cluster: Cluster) -> tuple[str, str]:
    first, second = cluster.replica_processes
    return first.url, second.url


async def open_session(url: str, headers: dict[str, str], query: str = "") -> tuple[RealtimeClient, dict]:
    client = await RealtimeClient.connect(f"{url.replace('http', 'ws', 1)}/v1/realtime?model={MODEL}{query}",
                                          headers=headers)
    return client, await client.recv()


async def test_a_client_secret_minted_on_one_replica_opens_one_session_on_the_other(cluster: Cluster) -> None:
    first, second = replica_urls(cluster)
    async with httpx.AsyncClient(timeout=30) as http:
        minted = await http.post(f"{first}/v1/realtime/client_secrets", headers=bearer("secrets"),
                                 json={"session": {"type": "realtime", "instructions": "Be brief."}})
    assert minted.status_code == 200, minted.text
    secret = {"authorization": f"Bearer {minted.json()['value']}"}
    client, created = await open_session(second, secret)
    assert created["type"] == "session.created" and created["session"]["instructions"] == "Be brief."
    again, refused = await open_session(first, secret)
    assert refused["type"] == "error" and refused["error"]["code"] == "invalid_api_key"
    await again.close()
    await client.close()


async def test_an_idempotent_retry_on_the_other_replica_replays(cluster: Cluster) -> None:
    first, second = replica_urls(cluster)
    body = {"model": MODEL, "messages": [{"role": "user", "content": "What is the capital of France?"}],
            "max_tokens": 8, "temperature": 0}
    headers = {**bearer("idempotency"), "idempotency-key": "order-42"}
    async with httpx.AsyncClient(timeout=60) as http:
        answer = await http.post(f"{first}/v1/chat/completions", json=body, headers=headers)
        retry = await http.post(f"{second}/v1/chat/completions", json=body, headers=headers)
        other_body = await http.post(f"{second}/v1/chat/completions", json={**body, "max_tokens": 9}, headers=headers)
    assert answer.status_code == retry.status_code == 200
    assert retry.headers["idempotent-replayed"] == "true" and retry.json() == answer.json()
    assert other_body.status_code == 422 and other_body.json()["error"]["code"] == "idempotency_key_reused"


async def test_a_rate_limit_is_one_bucket_for_both_replicas(cluster: Cluster) -> None:
    first, second = replica_urls(cluster)
    async with httpx.AsyncClient(timeout=30, headers=bearer("rate")) as http:
        statuses = [(await http.get(f"{url}/v1/models")).status_code for url in (first, second) * (RATE_PER_MINUTE // 2)]
        over = await http.get(f"{second}/v1/models")
    assert statuses == [200] * RATE_PER_MINUTE
    assert over.status_code == 429 and over.headers["x-ratelimit-remaining-requests"] == "0"


async def test_a_sideband_and_a_hangup_on_the_wrong_replica_reach_the_owner(cluster: Cluster) -> None:
    first, second = replica_urls(cluster)
    pc, _ = await make_offer()
    try:
        async with httpx.AsyncClient(timeout=30, headers=bearer("call")) as http:
            answer = await http.post(f"{first}/v1/realtime/calls", content=pc.localDescription.sdp,
                                     headers={"content-type": "application/sdp"})
            assert answer.status_code == 201, answer.text
            await pc.setRemoteDescription(RTCSessionDescription(sdp=answer.text, type="answer"))
            call_path = answer.headers["location"]
            call_id = call_path.rsplit("/", 1)[1]
            assert call_id.startswith("rtc_r0_")  # it names its replica

            # A sideband connection (the app's server steering the browser's call) through the other replica.
            sideband = await RealtimeClient.connect(
                f"{second.replace('http', 'ws', 1)}/v1/realtime?call_id={call_id}", headers=bearer("call"))
            await sideband.send({"type": "session.update", "session": {"type": "realtime", "instructions": "Sideband."}})
            updated = await sideband.wait_for("session.updated")
            assert updated["session"]["instructions"] == "Sideband."
            await sideband.close()
            for key, code in (("resume", "call_not_found"), ("call", "call_not_found")):
                other = await RealtimeClient.connect(
                    f"{second.replace('http', 'ws', 1)}/v1/realtime?call_id={call_id if key != 'call' else 'rtc_r1_00'}",
                    headers=bearer(key))
                refused = await other.recv()
                assert refused["type"] == "error" and refused["error"]["code"] == code
                await other.close()

            hung_up = await http.post(f"{second}{call_path}/hangup")
            assert hung_up.status_code == 200 and hung_up.json()["status"] == "ended", hung_up.text
            for _ in range(100):  # the owner ends the call: it no longer knows it
                gone = await http.post(f"{first}{call_path}/hangup")
                if gone.status_code == 404:
                    break
                await asyncio.sleep(0.05)
            assert gone.status_code == 404 and gone.json()["error"]["code"] == "call_not_found"
            unknown = await http.post(f"{second}/v1/realtime/calls/rtc_zz_0123/hangup")
            assert unknown.status_code == 404
    finally:
        await pc.close()


async def test_a_live_sessions_sideband_and_hangup_on_the_wrong_replica_reach_the_owner(cluster: Cluster) -> None:
    first, second = replica_urls(cluster)
    async with LiveCaller.connect(first, {"model": "gpt-live-1"}, microphone=False, api_key=KEYS["live"]) as caller:
        session_id = (await caller.wait_for("session.started"))["session"]["id"]
        assert session_id.startswith("sess_r0_")  # it names its replica
        async with LiveCaller.attach(second, session_id, api_key=KEYS["live"]) as sideband:
            await sideband.send({"type": "session.instructions.append", "content": "Be brief.", "event_id": "evt_1"})
            steered = await sideband.wait_for("session.instructions.appended")
            assert steered["client_event_id"] == "evt_1"
            await caller.wait_for("session.instructions.appended")  # it reached the session on the owner
        # A key sent as a subprotocol, as a browser sends it, reaches the owner through the relay too.
        async with websockets.connect(f"{second.replace('http', 'ws', 1)}/v1/live/sessions/{session_id}/attach",
                                      subprotocols=[f"openai-insecure-api-key.{KEYS['live']}"]) as raw:  # type: ignore[list-item]
            await raw.send(json.dumps({"type": "session.thinking.append", "content": "The user is busy.",
                                       "event_id": "evt_2"}))
            while (event := json.loads(await asyncio.wait_for(raw.recv(), 30)))["type"] != "session.thinking.appended":
                assert event["type"] != "error", event
            assert event["client_event_id"] == "evt_2"
        async with httpx.AsyncClient(timeout=30) as http:
            other_key = await http.post(f"{second}/v1/live/sessions/{session_id}/hangup", headers=bearer("call"))
            assert other_key.status_code == 404 and other_key.json()["error"]["code"] == "session_not_found"
            hung_up = await http.post(f"{second}/v1/live/sessions/{session_id}/hangup", headers=bearer("live"))
            assert hung_up.status_code == 200, hung_up.text
            assert (await caller.wait_for("session.closed", timeout=10))["reason"] == "close_requested"
            for _ in range(100):  # the owner ends the session: it no longer knows it
                gone = await http.post(f"{first}/v1/live/sessions/{session_id}/hangup", headers=bearer("live"))
                if gone.status_code == 404:
                    break
                await asyncio.sleep(0.05)
            assert gone.status_code == 404 and gone.json()["error"]["code"] == "session_not_found"
            unknown = await http.post(f"{second}/v1/live/sessions/sess_zz_0123/hangup", headers=bearer("live"))
            assert unknown.status_code == 404


async def test_a_resume_that_reaches_the_other_replica_is_relayed_to_the_owner(cluster: Cluster) -> None:
    first, second = replica_urls(cluster)
    client, created = await open_session(first, bearer("resume"))
    token = created["resume_token"]
    assert token.startswith("r0.")  # it names its replica
    await client.send(TEXT_ONLY)
    updated = await client.wait_for("session.updated")
    last_sequence = updated["sequence_number"]
    client.connection.transport.abort()  # no close frame: the owner parks the session
    await asyncio.sleep(0.3)
    resumed = await RealtimeClient.connect(
        f"{second.replace('http', 'ws', 1)}/v1/realtime?resume={token}&last_sequence={last_sequence}",
        headers=bearer("resume"))
    done = await resumed.ask("What is the capital of France?")
    assert done["response"]["status"] in ("completed", "incomplete")
    assert resumed.events[0]["sequence_number"] == last_sequence + 1  # no gap, no duplicate, through the relay
    await resumed.close()


async def test_a_drained_replica_hands_its_session_off_and_the_conversation_goes_on(cluster: Cluster) -> None:
    """Last in this module: it stops a replica."""
    first, second = replica_urls(cluster)
    client, _ = await open_session(first, bearer("drain"))
    await client.send(TEXT_ONLY)
    await client.wait_for("session.updated")
    done = await client.ask("My name is Ada. What is the capital of France?")
    assert done["response"]["status"] in ("completed", "incomplete")  # incomplete: at max_output_tokens
    # SIGTERM in the middle of a reply: the reply finishes, then the session is handed off.
    await client.send({"type": "conversation.item.create", "item": {"type": "message", "role": "user", "content": [
        {"type": "input_text", "text": "And of Italy?"}]}})
    await client.send({"type": "response.create"})
    await client.wait_for("response.output_text.delta")
    cluster.replica_processes[0].process.terminate()  # type: ignore[union-attr]  # SIGTERM: drain
    finished = await client.wait_for("response.done", timeout=30)
    assert finished["response"]["status"] in ("completed", "incomplete")
    handoff = await client.wait_for("error", timeout=30)
    assert handoff["error"]["code"] == "session_handoff"
    with pytest.raises(websockets.ConnectionClosed) as closed:
        while True:
            await client.connection.recv()
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1012
    conversation = json.loads(closed.value.rcvd.reason)["conversation"]
    assert conversation in handoff["error"]["message"]
    assert cluster.replica_processes[0].process.wait(30) is not None  # type: ignore[union-attr]

    # Through the router: the drained replica is out of rotation, the other takes the conversation.
    assert cluster.router is not None
    goes_on, created = await open_session(cluster.router.url, bearer("drain"), f"&conversation={conversation}")
    assert created["type"] == "session.created"
    await goes_on.send(TEXT_ONLY)
    await goes_on.wait_for("session.updated")
    loaded = [e["item"] for e in goes_on.events if e["type"] == "conversation.item.added"]
    texts = " ".join(part.get("text", "") for item in loaded for part in item.get("content", []))
    assert "Ada" in texts and len(loaded) >= 2
    answer = await goes_on.ask("What is my name?")
    assert answer["response"]["status"] in ("completed", "incomplete")
    await goes_on.close()
