"""The HTTP side of "no input ends, mutes or leaks a session" (issue 14), against real gateways.

Malformed bodies get 400 and the keep-alive connection goes on; one body-size limit covers every
endpoint, read as it streams; sessions and client secrets are bounded per key and in total; a client
that never finishes its request head is cut off; /metrics labels are route templates; keys never
reach the log, at any level; chat types are strict; multipart WebRTC offers work; the OpenAPI
document describes the request bodies and errors, and schemathesis finds no 500 against it.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import re
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import websockets
from aiortc import RTCConfiguration, RTCDataChannel, RTCPeerConnection, RTCSessionDescription

from tests.gateway_process import GatewayProcess, start_gateway
from tests.integration.conftest import MODEL
from tests.integration.realtime_client import RealtimeClient
from tests.peers import PacedClipTrack

KEY_A = "sk-hardening-a-5f1c0ffee0ddba11"
KEY_B = "sk-hardening-b-0b57ac1e5ca1ab1e"
WRONG_KEY = "sk-not-configured-7e11a1e5"
MAX_REQUEST_BYTES = 32 * 1024
HEAD_TIMEOUT_S = 2.0
KEEP_ALIVE_S = 1
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 3}


@pytest.fixture(scope="module")
def bounded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    """Two keys, debug logging, small bounds: 3 sessions (2 per key), 3 outstanding client secrets
    per key, 32 KiB bodies, a 2 s request-head timeout and a 1 s keep-alive."""
    process = start_gateway(
        "--api-keys", f"{KEY_A},{KEY_B}",
        "--log-level", "debug",
        "--max-sessions", "3",
        "--max-sessions-per-key", "2",
        "--max-client-secrets-per-key", "3",
        "--max-request-bytes", str(MAX_REQUEST_BYTES),
        "--http-head-timeout-s", str(HEAD_TIMEOUT_S),
        "--http-keep-alive-s", str(KEEP_ALIVE_S),
        log_path=tmp_path_factory.mktemp("bounded") / "gateway.log",
    )  # fmt: skip
    yield process
    process.stop()


@pytest.fixture
def loopback_ice(monkeypatch: pytest.MonkeyPatch) -> None:
    # aioice never offers 127.0.0.1 by itself (the gateway has --ice-host-addresses for this).
    monkeypatch.setattr("aioice.ice.get_host_addresses", lambda use_ipv4, use_ipv6: ["127.0.0.1"])


def bearer(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


# -- 5. malformed bodies: 400, never 500, and the keep-alive connection goes on -----------------------------

def body(**fields: Any) -> str:
    return json.dumps({**CHAT, **fields})


def called(calls: Any) -> list[dict[str, Any]]:
    """A history in which the assistant called `calls`, then the user asks on."""
    return [{"role": "user", "content": "Look it up."}, {"role": "assistant", "content": None, "tool_calls": calls},
            {"role": "user", "content": "And?"}]


CALL = {"id": "call_1", "type": "function", "function": {"name": "lookup", "arguments": "{}"}}
MALFORMED_CALLS = [  # an assistant message's tool_calls (each was a 500, or reached the model as garbage)
    ("[{function: 5}]", [{"function": 5}], "missing_required_parameter", "[0].id"),
    ("function 5", [{**CALL, "function": 5}], "invalid_type", "[0].function"),
    ("function null", [{**CALL, "function": None}], "invalid_type", "[0].function"),
    ("type custom", [{**CALL, "type": "custom"}], "invalid_value", "[0].type"),
    ("id 7", [{**CALL, "id": 7}], "invalid_type", "[0].id"),
    ("no function name", [{**CALL, "function": {"arguments": "{}"}}], "missing_required_parameter", "[0].function.name"),
    ("name 5", [{**CALL, "function": {"name": 5, "arguments": "{}"}}], "invalid_type", "[0].function.name"),
    ("arguments an object", [{**CALL, "function": {"name": "lookup", "arguments": {}}}], "invalid_type",
     "[0].function.arguments"),
    ("second call broken", [CALL, {**CALL, "function": [1]}], "invalid_type", "[1].function"),
]
NESTED = "[" * 1000 + "]" * 1000
DIGITS = "9" * 5000
MALFORMED_CHAT = [
    ("deep nesting", body(tools=None).replace('"tools": null', '"tools": ' + NESTED), "invalid_json", None),
    ("deep nesting, the whole body", NESTED, "invalid_json", None),
    ("a 5,000-digit max_tokens", body(max_tokens=None).replace('"max_tokens": null', '"max_tokens": ' + DIGITS),
     "invalid_json", None),
    ("a 5,000-digit float", body(temperature=None).replace('"temperature": null', '"temperature": 1' + DIGITS + ".5"),
     "invalid_json", None),
    ("1e999", body(temperature=None).replace('"temperature": null', '"temperature": 1e999'), "invalid_json", None),
    ("NaN", body(temperature=None).replace('"temperature": null', '"temperature": NaN'), "invalid_json", None),
    ("a lone surrogate in model", body(model="@").replace('"@"', '"\\ud800"'), "invalid_json", "model"),
    ("a lone surrogate in content", body(messages=[{"role": "user", "content": "@"}]).replace('"@"', '"a\\udfffb"'),
     "invalid_json", "messages[0].content"),
    ("a lone surrogate in a text part", body(messages=[{"role": "user", "content": [{"type": "text", "text": "@"}]}])
     .replace('"@"', '"\\udc00"'), "invalid_json", "messages[0].content[0].text"),
    ("a lone surrogate in a key", body(metadata={"@": 1}).replace('"@"', '"\\ud801"'), "invalid_json", "metadata"),
    ("seed 2**64", body(seed=2**64), "invalid_value", "seed"),
    ("seed 2**63", body(seed=2**63), "invalid_value", "seed"),
    ("seed -2**63 - 1", body(seed=-(2**63) - 1), "invalid_value", "seed"),
    ("stream 'yes'", body(stream="yes"), "invalid_type", "stream"),
    ("n '1'", body(n="1"), "invalid_type", "n"),
    ("temperature true", body(temperature=True), "invalid_type", "temperature"),
    ("max_tokens '5'", body(max_tokens="5"), "invalid_type", "max_tokens"),
    ("include_usage 1", body(stream=True, stream_options={"include_usage": 1}), "invalid_type",
     "stream_options.include_usage"),
    ("not UTF-8", body(model="@").replace("@", "\udcff"), "invalid_json", None),
    *((f"tool_calls {case}", body(messages=called(calls)), code, f"messages[1].tool_calls{param}")
      for case, calls, code, param in MALFORMED_CALLS),
]
MALFORMED_SECRETS = [
    ("deep nesting", '{"session": {"tools": ' + NESTED + "}}", "invalid_json", None),
    ("a 5,000-digit number", '{"expires_after": {"anchor": "created_at", "seconds": ' + DIGITS + "}}", "invalid_json",
     None),
    ("a lone surrogate in instructions", '{"session": {"instructions": "x\\udc00"}}', "invalid_json",
     "session.instructions"),
    ("not UTF-8", '{"session": {"instructions": "\udcff"}}', "invalid_json", None),
    ("not an object", "[1]", "invalid_request", None),
    ("expires_after.seconds '60'", '{"expires_after": {"anchor": "created_at", "seconds": "60"}}', "invalid_type",
     "expires_after.seconds"),
]


def encoded(text: str) -> bytes:
    """UTF-8, except that a lone \\udcXX surrogate stands for the raw byte 0xXX (invalid UTF-8)."""
    return text.encode("utf-8", "surrogateescape")


def exchange(connection: http.client.HTTPConnection, method: str, path: str, content: bytes = b"",
             headers: dict[str, str] | None = None) -> tuple[int, dict[str, Any]]:
    connection.request(method, path, body=content or None, headers={"content-type": "application/json", **(headers or {})})
    response = connection.getresponse()
    return response.status, json.loads(response.read() or b"null")


@pytest.mark.parametrize(("path", "case", "text", "code", "param"), [
    *(pytest.param("/v1/chat/completions", *case, id=f"chat: {case[0]}") for case in MALFORMED_CHAT),
    *(pytest.param("/v1/realtime/client_secrets", *case, id=f"secrets: {case[0]}") for case in MALFORMED_SECRETS),
])
def test_malformed_bodies_get_400_and_the_connection_goes_on(
    gateway: GatewayProcess, path: str, case: str, text: str, code: str, param: str | None
) -> None:
    connection = http.client.HTTPConnection(gateway.host, gateway.port, timeout=30)
    try:
        status, answer = exchange(connection, "POST", path, encoded(text))
        assert status == 400, (case, answer)
        assert answer["error"]["type"] == "invalid_request_error" and answer["error"]["code"] == code, (case, answer)
        assert answer["error"]["param"] == param, (case, answer)
        first_socket = connection.sock
        assert first_socket is not None  # not closed after the answer
        # The next request on the same keep-alive connection is answered (a 500 used to reset it).
        status, _ = exchange(connection, "GET", "/healthz")
        assert status == 200 and connection.sock is first_socket
    finally:
        connection.close()


def test_a_tool_call_history_is_validated_in_every_chat_api(gateway: GatewayProcess) -> None:
    """A conversation's chat request takes the same messages: a malformed call is refused before anything is
    stored, and a well-formed call history is answered, with and without a conversation."""
    with httpx.Client(base_url=gateway.url, timeout=60) as http:
        conversation = http.post("/backend-api/conversations", json={}).json()["id"]
        for case, calls, code, param in MALFORMED_CALLS:
            refused = http.post("/v1/chat/completions", json={**CHAT, "messages": called(calls),
                                                              "conversation": conversation})
            assert refused.status_code == 400, (case, refused.text)
            assert refused.json()["error"] == {**refused.json()["error"], "type": "invalid_request_error", "code": code,
                                               "param": f"messages[1].tool_calls{param}"}, case
        assert http.get(f"/backend-api/conversation/{conversation}").json()["messages"] == []
        for extra in ({}, {"conversation": conversation}):
            answered = http.post("/v1/chat/completions", json={**CHAT, "messages": called([CALL]), **extra})
            assert answered.status_code == 200, answered.text
        stored = http.get(f"/backend-api/conversation/{conversation}").json()["messages"]
        assert [message["role"] for message in stored] == ["user", "assistant", "user", "assistant"]
        assert stored[1]["tool_calls"] == [CALL]


def test_a_tiny_temperature_is_greedy_not_nan(gateway: GatewayProcess) -> None:
    """5e-324 made the sampler's probabilities inf/NaN; below 0.01 a temperature now samples greedily."""
    answers = []
    for temperature in (0, 5e-324, 0.004):
        response = httpx.post(f"{gateway.url}/v1/chat/completions", json={**CHAT, "max_tokens": 8,
                              "temperature": temperature}, timeout=60)
        assert response.status_code == 200, response.text
        answers.append(response.json()["choices"][0]["message"]["content"])
    assert answers[0] == answers[1] == answers[2]


def test_int64_seeds_at_the_edges_are_accepted(gateway: GatewayProcess) -> None:
    for seed in (2**63 - 1, -(2**63)):
        response = httpx.post(f"{gateway.url}/v1/chat/completions", json={**CHAT, "seed": seed, "temperature": 1},
                              timeout=60)
        assert response.status_code == 200, response.text


# -- 7. one body-size limit, read as the body streams ------------------------------------------------------

def raw_request(gateway: GatewayProcess, head: bytes, chunks: Iterator[bytes], timeout_s: float = 10.0) -> bytes:
    """Send a request head and then body chunks without ever ending the body; return what the server
    answered before it closed the connection (or the timeout passed)."""
    with socket.create_connection((gateway.host, gateway.port), timeout=timeout_s) as sock:
        sock.sendall(head)
        for chunk in chunks:
            try:
                sock.sendall(chunk)
            except OSError:  # the server answered and closed while we were still sending
                break
        received = b""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                data = sock.recv(65536)
            except (TimeoutError, ConnectionResetError):
                break
            if not data:
                break
            received += data
            if b"\r\n\r\n" in received and received.split(b"\r\n\r\n", 1)[1].rstrip().endswith(b"}"):
                break
    return received


def chunked(total: int, size: int = 4096) -> Iterator[bytes]:
    """`total` bytes of a body in chunked encoding, with no final zero-length chunk: the body never
    ends. Only a little past the limit, so that the server has read all of it when it answers and
    closes (unread bytes would make the close a reset, which may cut the answer off)."""
    for _ in range(total // size):
        yield f"{size:x}\r\n".encode() + b"x" * size + b"\r\n"


def status_and_error(raw: bytes) -> tuple[int, dict[str, Any]]:
    head, _, rest = raw.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    return status, json.loads(rest)["error"]


def test_client_secrets_body_over_the_limit_is_413(bounded: GatewayProcess) -> None:
    big = {"session": {"instructions": "x" * (MAX_REQUEST_BYTES + 1)}}
    response = httpx.post(f"{bounded.url}/v1/realtime/client_secrets", json=big, headers=bearer(KEY_A))
    assert response.status_code == 413 and response.json()["error"]["code"] == "request_too_large"
    assert response.json()["error"]["type"] == "invalid_request_error"


@pytest.mark.parametrize("path", ["/v1/realtime/client_secrets", "/v1/chat/completions", "/v1/realtime/calls"])
def test_a_chunked_body_is_cut_off_at_the_limit_before_it_ends(bounded: GatewayProcess, path: str) -> None:
    media_type = "application/sdp" if path.endswith("/calls") else "application/json"
    head = (f"POST {path} HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {KEY_A}\r\n"
            f"content-type: {media_type}\r\ntransfer-encoding: chunked\r\n\r\n").encode()
    started = time.monotonic()
    status, error = status_and_error(raw_request(bounded, head, chunked(MAX_REQUEST_BYTES + 8192)))
    assert status == 413 and error["code"] == "request_too_large"
    assert time.monotonic() - started < 5


def test_the_calls_endpoint_keeps_its_own_smaller_limit_while_reading(gateway: GatewayProcess) -> None:
    # The gateway's limit is 4 MiB; an SDP offer stops at 64 KiB, and the answer comes before the body ends.
    head = (b"POST /v1/realtime/calls HTTP/1.1\r\nhost: x\r\ncontent-type: application/sdp\r\n"
            b"transfer-encoding: chunked\r\n\r\n")
    status, error = status_and_error(raw_request(gateway, head, chunked(64 * 1024 + 8192)))
    assert status == 413 and error["code"] == "request_too_large"


# -- 7. sessions and client secrets, per key and in total --------------------------------------------------

async def open_ws(gateway: GatewayProcess, key: str) -> tuple[RealtimeClient, dict[str, Any]]:
    client = await RealtimeClient.connect(f"{gateway.ws_url}/v1/realtime", headers=bearer(key))
    return client, await client.recv()


async def make_offer() -> tuple[RTCPeerConnection, RTCDataChannel]:
    """A browser's offer: a microphone (silent) and the events channel."""
    pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    channel = pc.createDataChannel("oai-events")
    pc.addTrack(PacedClipTrack(np.zeros(0, np.int16)))
    await pc.setLocalDescription(await pc.createOffer())
    return pc, channel


async def wait_no_sessions(gateway: GatewayProcess) -> None:
    """Until the gateway has closed every session (closing is asynchronous after a client leaves)."""
    async with httpx.AsyncClient(base_url=gateway.url) as http:
        for _ in range(100):
            text = (await http.get("/metrics")).text
            live = [float(v) for v in re.findall(r"^gateway_active_sessions\{[^}]*\} (\S+)$", text, flags=re.M)]
            if sum(live) == 0:
                return
            await asyncio.sleep(0.1)
    raise AssertionError("sessions still open")


async def test_sessions_are_bounded_per_key_and_in_total(bounded: GatewayProcess, loopback_ice: None) -> None:
    await wait_no_sessions(bounded)
    opened: list[RealtimeClient] = []
    pc, _ = await make_offer()
    try:
        for _ in range(2):
            client, created = await open_ws(bounded, KEY_A)
            opened.append(client)
            assert created["type"] == "session.created"
        # Refused before the upgrade (it was a 101, an error event and a 1013 close): 429 and OpenAI's body.
        with pytest.raises(websockets.InvalidStatus) as third:
            await open_ws(bounded, KEY_A)
        assert third.value.response.status_code == 429 and int(third.value.response.headers["retry-after"]) >= 1
        assert json.loads(third.value.response.body or b"")["error"]["code"] == "too_many_sessions"
        # A WebRTC call counts as a session too: the third and last one.
        async with httpx.AsyncClient(base_url=bounded.url, timeout=30) as http:
            answer = await http.post("/v1/realtime/calls", content=pc.localDescription.sdp,
                                     headers={"content-type": "application/sdp", **bearer(KEY_B)})
            assert answer.status_code == 201, answer.text
            call_url = answer.headers["location"]
            await pc.setRemoteDescription(RTCSessionDescription(sdp=answer.text, type="answer"))
            # KEY_B has room (1 of 2) but the replica is full (3 of 3): over HTTP a 503 with Retry-After, so that
            # a router tries another replica.
            second_pc, _ = await make_offer()
            full = await http.post("/v1/realtime/calls", content=second_pc.localDescription.sdp,
                                   headers={"content-type": "application/sdp", **bearer(KEY_B)})
            await second_pc.close()
            assert full.status_code == 503, full.text
            assert full.json()["error"]["code"] == "replica_full" and int(full.headers["retry-after"]) >= 1
            # A WebSocket too: 503 with Retry-After during the handshake, so that a router retries it elsewhere.
            with pytest.raises(websockets.InvalidStatus) as full_ws:
                await open_ws(bounded, KEY_B)
            assert full_ws.value.response.status_code == 503 and int(full_ws.value.response.headers["retry-after"]) >= 1
            assert json.loads(full_ws.value.response.body or b"")["error"]["code"] == "replica_full"
            # A session that ends frees its place.
            assert (await http.post(f"{call_url}/hangup", headers=bearer(KEY_B))).status_code == 200
            for _ in range(50):
                try:
                    client, created = await open_ws(bounded, KEY_B)
                except websockets.InvalidStatus:
                    await asyncio.sleep(0.1)
                    continue
                opened.append(client)
                break
            assert created["type"] == "session.created"
    finally:
        await pc.close()
        for client in opened:
            await client.close()
    await wait_no_sessions(bounded)


async def test_a_failed_call_does_not_spend_the_ephemeral_key(bounded: GatewayProcess) -> None:
    async with httpx.AsyncClient(base_url=bounded.url, timeout=30) as http:
        minted = await http.post("/v1/realtime/client_secrets", json={}, headers=bearer(KEY_A))
        secret = minted.json()["value"]
        bad = await http.post("/v1/realtime/calls", content="v=0\r\nnot an offer",
                              headers={"content-type": "application/sdp", **bearer(secret)})
        assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_sdp"
    client, created = await open_ws(bounded, secret)  # the key still opens its one session
    assert created["type"] == "session.created"
    await client.close()
    again, refused = await open_ws(bounded, secret)
    assert refused["error"]["code"] == "invalid_api_key"
    await again.close()
    await wait_no_sessions(bounded)


def test_outstanding_client_secrets_are_bounded_per_key(bounded: GatewayProcess) -> None:
    url = f"{bounded.url}/v1/realtime/client_secrets"
    for _ in range(3):
        assert httpx.post(url, json={}, headers=bearer(KEY_B)).status_code == 200
    refused = httpx.post(url, json={}, headers=bearer(KEY_B))
    assert refused.status_code == 429 and refused.json()["error"]["code"] == "too_many_client_secrets"
    assert 1 <= int(refused.headers["retry-after"]) <= 600
    assert httpx.post(url, json={}, headers=bearer(KEY_A)).status_code == 200  # another key is not affected


# -- 7. request-head and keep-alive timeouts ---------------------------------------------------------------

def seconds_until_closed(gateway: GatewayProcess, first: bytes, trickle: bytes, every_s: float, limit_s: float) -> float:
    """Send `first`, then one byte of `trickle` every `every_s` (forever, up to `limit_s`): the seconds
    until the server closed the connection."""
    started = time.monotonic()
    with socket.create_connection((gateway.host, gateway.port)) as sock:
        sock.settimeout(every_s)
        sock.sendall(first)
        index = 0
        while time.monotonic() - started < limit_s:
            try:
                if sock.recv(4096) == b"":
                    return time.monotonic() - started
            except TimeoutError:
                pass
            except ConnectionResetError:
                return time.monotonic() - started
            try:
                sock.sendall(trickle[index % len(trickle) : index % len(trickle) + 1])
            except OSError:
                return time.monotonic() - started
            index += 1
    return time.monotonic() - started


def test_a_request_head_sent_byte_by_byte_is_cut_off(bounded: GatewayProcess) -> None:
    elapsed = seconds_until_closed(bounded, b"GET /healthz HTTP/1.1\r\nhost: x\r\nx-slow: ", b"abcdefgh", 0.2, 15)
    assert HEAD_TIMEOUT_S - 0.5 < elapsed < HEAD_TIMEOUT_S + 3, elapsed  # slack for a loaded machine


def test_a_silent_connection_is_cut_off(bounded: GatewayProcess) -> None:
    with socket.create_connection((bounded.host, bounded.port), timeout=15) as sock:
        started = time.monotonic()
        assert sock.recv(4096) == b""
        assert time.monotonic() - started < HEAD_TIMEOUT_S + 3


def test_an_idle_keep_alive_connection_is_closed(bounded: GatewayProcess) -> None:
    with socket.create_connection((bounded.host, bounded.port), timeout=15) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n")
        assert sock.recv(65536).startswith(b"HTTP/1.1 200")
        started = time.monotonic()
        while sock.recv(65536):
            pass
        assert time.monotonic() - started < KEEP_ALIVE_S + 3


def test_an_oversized_request_head_gets_431(bounded: GatewayProcess) -> None:
    with socket.create_connection((bounded.host, bounded.port), timeout=15) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nhost: x\r\n")
        try:
            for _ in range(64):
                sock.sendall(b"x-filler: " + b"y" * 4096 + b"\r\n")
        except OSError:
            pass
        assert sock.recv(65536).startswith(b"HTTP/1.1 431")


# -- 8. /metrics labels ------------------------------------------------------------------------------------

async def test_metrics_label_routes_by_template(bounded: GatewayProcess) -> None:
    async with httpx.AsyncClient(base_url=bounded.url) as http:
        for index in range(60):
            await http.get(f"/v1/models/made-up-{index}")  # 401: no key
            await http.get(f"/v1/made-up-{index}")  # 404
            await http.post(f"/v1/realtime/calls/rtc_made-up-{index}/hangup")
        metrics = (await http.get("/metrics")).text
    assert "made-up" not in metrics
    routes = set(re.findall(r'^gateway_http_requests_total\{route="([^"]*)"', metrics, flags=re.M))
    assert {"/v1/models/{model_id}", "/v1/realtime/calls/{call_id}/hangup", "unmatched"} <= routes
    assert all(route == "unmatched" or route.startswith("/") for route in routes)
    assert len(routes) < 20, routes


# -- 9. keys in the log ------------------------------------------------------------------------------------

async def test_keys_never_reach_the_log(bounded: GatewayProcess) -> None:
    secret = httpx.post(f"{bounded.url}/v1/realtime/client_secrets", json={}, headers=bearer(KEY_A)).json()["value"]
    httpx.get(f"{bounded.url}/v1/models?api_key={KEY_B}&key={KEY_B}&token={secret}", headers=bearer(KEY_A))
    httpx.get(f"{bounded.url}/v1/models", headers=bearer(WRONG_KEY))
    client, created = await open_ws(bounded, KEY_B)  # the handshake's headers are logged at debug level
    assert created["type"] == "session.created"
    await client.close()
    connection = await websockets.connect(
        f"{bounded.ws_url}/v1/realtime?model={MODEL}&api_key={KEY_A}",
        subprotocols=["realtime", f"openai-insecure-api-key.{secret}"],  # type: ignore[list-item]
    )
    assert json.loads(await connection.recv())["type"] == "session.created"
    await connection.close()
    await wait_no_sessions(bounded)
    log = Path(bounded.log_path).read_text(errors="replace")
    assert '"route": "/v1/models"' in log and "< authorization:" in log.lower()  # debug logging did run
    for leaked in (KEY_A, KEY_B, WRONG_KEY, secret, secret[3:]):
        assert leaked not in log, f"{leaked[:8]}... is in the log"


# -- 6. multipart WebRTC offers ----------------------------------------------------------------------------

async def test_a_multipart_offer_opens_a_call_with_its_session(gateway: GatewayProcess, loopback_ice: None) -> None:
    """The `sdp` part as a field (as browsers send it) and as a file (as `curl -F sdp=@offer.sdp` does)."""
    session = json.dumps({"type": "realtime", "instructions": "Be brief.", "output_modalities": ["text"]})
    for sdp_as_file in (False, True):
        pc, channel = await make_offer()
        events: list[dict[str, Any]] = []
        opened = asyncio.Event()
        channel.on("message", lambda message, events=events: events.append(json.loads(message)))
        channel.on("open", opened.set)
        sdp = pc.localDescription.sdp
        files = {"sdp": ("offer.sdp", sdp, "application/sdp") if sdp_as_file else (None, sdp), "session": (None, session)}
        try:
            async with httpx.AsyncClient(base_url=gateway.url, timeout=30) as http:
                answer = await http.post("/v1/realtime/calls", files=files)
                assert answer.status_code == 201, answer.text
                await pc.setRemoteDescription(RTCSessionDescription(sdp=answer.text, type="answer"))
                await asyncio.wait_for(opened.wait(), 10)
                for _ in range(100):
                    if events:
                        break
                    await asyncio.sleep(0.05)
                assert events and events[0]["type"] == "session.created"
                assert events[0]["session"]["instructions"] == "Be brief."
                assert events[0]["session"]["output_modalities"] == ["text"]
                await http.post(f"{answer.headers['location']}/hangup")
        finally:
            await pc.close()


@pytest.mark.parametrize(("session", "status", "code", "param"), [
    ("[1, 2]", 400, "invalid_type", "session"),
    ('"text"', 400, "invalid_type", "session"),
    ("{not json", 400, "invalid_json", "session"),
    ('{"instructions": "\\ud800"}', 400, "invalid_json", "session.instructions"),
    ('{"output_modalities": ["smell"]}', 400, "invalid_value", "session.output_modalities[0]"),
])
async def test_a_bad_session_part_is_a_400(gateway: GatewayProcess, loopback_ice: None, session: str, status: int,
                                           code: str, param: str) -> None:
    pc, _ = await make_offer()
    try:
        async with httpx.AsyncClient(base_url=gateway.url, timeout=30) as http:
            answer = await http.post("/v1/realtime/calls",
                                     files={"sdp": (None, pc.localDescription.sdp), "session": (None, session)})
    finally:
        await pc.close()
    assert answer.status_code == status, answer.text
    assert answer.json()["error"]["code"] == code and answer.json()["error"]["param"] == param


def test_a_multipart_without_sdp_or_with_bad_framing_is_a_400(gateway: GatewayProcess) -> None:
    url = f"{gateway.url}/v1/realtime/calls"
    missing = httpx.post(url, files={"session": (None, "{}")})
    assert missing.status_code == 400 and missing.json()["error"]["param"] == "sdp"
    broken = httpx.post(url, content=b"--x\r\nnonsense", headers={"content-type": "multipart/form-data; boundary=x"})
    assert broken.status_code == 400
    no_boundary = httpx.post(url, content=b"sdp=1", headers={"content-type": "multipart/form-data"})
    assert no_boundary.status_code == 400


# -- 11. the OpenAPI document, and schemathesis against it -------------------------------------------------

def test_openapi_documents_request_bodies_and_errors(gateway: GatewayProcess) -> None:
    document = httpx.get(f"{gateway.url}/openapi.json").json()
    paths = document["paths"]
    chat = paths["/v1/chat/completions"]["post"]
    assert "application/json" in chat["requestBody"]["content"]
    secrets = paths["/v1/realtime/client_secrets"]["post"]
    assert "application/json" in secrets["requestBody"]["content"]
    calls = paths["/v1/realtime/calls"]["post"]
    assert {"application/sdp", "multipart/form-data"} <= set(calls["requestBody"]["content"])
    schemas = document["components"]["schemas"]
    assert {"model", "messages"} <= set(schemas["ChatCompletionRequest"]["required"])
    for operation, statuses in ((chat, {"400", "401", "404", "413", "429"}), (secrets, {"400", "401", "413", "429"}),
                                (calls, {"400", "401", "413", "415", "429"})):
        assert statuses <= set(operation["responses"]), operation["responses"].keys()
        ref = operation["responses"]["400"]["content"]["application/json"]["schema"]["$ref"]
        assert schemas[ref.rsplit("/", 1)[1]]["required"] == ["error"]


def test_schemathesis_finds_no_server_error(gateway: GatewayProcess) -> None:
    """Every operation with bodies from its schema, and those with a body also with bodies that break
    it; chat requests and responses name the served model (with 2 tokens at most), so that they reach the engine."""
    schemathesis = pytest.importorskip("schemathesis")
    from schemathesis import GenerationMode

    schema = schemathesis.openapi.from_url(f"{gateway.url}/openapi.json")
    try:
        for result in schema.get_all_operations():
            operation = result.ok()
            explore(gateway, operation, GenerationMode.POSITIVE)
            if operation.body:
                explore(gateway, operation, GenerationMode.NEGATIVE)
    finally:  # it turned memory on (POST /v1/memories/settings), which gives the shared gateway's prompts the tool
        assert httpx.post(f"{gateway.url}/v1/memories/settings", json={"enabled": False}).status_code == 200
        assert httpx.delete(f"{gateway.url}/v1/memories").status_code == 200


def explore(gateway: GatewayProcess, operation: Any, mode: Any) -> None:
    """100 generated requests (the same ones every run): no 500, and every answer documented. A hang fails
    on the request's timeout."""
    from hypothesis import HealthCheck, given, settings
    from schemathesis import GenerationMode
    from schemathesis.checks import not_a_server_error, response_schema_conformance, status_code_conformance

    @settings(max_examples=60, deadline=None, database=None, derandomize=True, suppress_health_check=list(HealthCheck))
    @given(case=operation.as_strategy(generation_mode=mode))
    def check(case: Any) -> None:
        if case.path == "/v1/chat/completions" and mode == GenerationMode.POSITIVE:
            case.body = {**case.body, "model": MODEL, "max_tokens": 2}
            case.body.pop("max_completion_tokens", None)
        if case.path == "/v1/responses" and case.method == "POST" and mode == GenerationMode.POSITIVE:
            case.body = {**case.body, "model": MODEL, "max_output_tokens": 2}
        case.call_and_validate(base_url=gateway.url, timeout=60,
                               checks=[not_a_server_error, status_code_conformance, response_schema_conformance])

    check()
