"""Requests that reach a replica which does not own their call or session, passed on to the one that does.

Call ids (`rtc_<replica>_...`), GPT-Live session ids (`sess_<replica>_...`) and resume tokens (`<replica>.<...>`)
name the replica that holds them;
the Redis directory (gateway/platform/redis_state.py) gives its URL. A router that is sticky per session sends most
requests to the owner already; these cover the rest (a hangup from a backend server, a client resuming
after its connection moved).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping

import httpx
import websockets
from fastapi import Request, WebSocket
from fastapi.responses import Response
from starlette.websockets import WebSocketDisconnect, WebSocketState

from gateway.protocol.errors import ApiError

log = logging.getLogger(__name__)

FORWARD_TIMEOUT_S = 10.0
# Hop-by-hop and connection headers are the relay's own, never the client's.
_NOT_FORWARDED = {"host", "connection", "content-length", "transfer-encoding", "upgrade", "sec-websocket-key",
                  "sec-websocket-version", "sec-websocket-extensions", "sec-websocket-protocol", "keep-alive"}


def replica_of(identifier: str) -> str:
    """The replica named in a call id (`rtc_<replica>_<hex>`), a GPT-Live session id (`sess_<replica>_<hex>`) or a
    resume token (`<replica>.<token>`); "" when it names none (a Realtime session id, an id from before replicas
    had names)."""
    if identifier.startswith(("rtc_", "sess_")) and identifier.count("_") >= 2:
        return identifier.split("_", 2)[1]
    head, dot, _ = identifier.partition(".")
    return head if dot else ""


def _headers(headers: Mapping[str, str]) -> dict[str, str]:
    return {name: value for name, value in headers.items() if name.lower() not in _NOT_FORWARDED}


async def forward_post(owner_url: str, request: Request) -> Response:
    """The owner's answer to this POST (its status, body and content type)."""
    try:
        async with httpx.AsyncClient(timeout=FORWARD_TIMEOUT_S) as client:
            answer = await client.post(f"{owner_url.rstrip('/')}{request.url.path}", content=await request.body(),
                                       headers=_headers(request.headers), params=request.query_params)
    except httpx.HTTPError as exc:
        raise ApiError("replica_unavailable", f"The replica that holds this call did not answer: {exc}",
                       type="server_error", status=503, retry_after_s=1.0) from None
    return Response(answer.content, answer.status_code, media_type=answer.headers.get("content-type"))


async def relay_websocket(websocket: WebSocket, owner_url: str) -> None:
    """Carry an accepted WebSocket's frames to and from the same path and query on the owner replica, and
    close each side with the code the other closed with. The owner is offered the client's own subprotocols, so a
    key sent in one (`openai-insecure-api-key.<key>`, as browsers send theirs) authenticates there too."""
    offered = [p.strip() for p in websocket.headers.get("sec-websocket-protocol", "").split(",") if p.strip()]
    target = owner_url.rstrip("/").replace("http", "ws", 1) + websocket.url.path
    if websocket.url.query:
        target += f"?{websocket.url.query}"
    try:
        upstream = await websockets.connect(target, additional_headers=_headers(websocket.headers),
                                            subprotocols=offered or None,  # type: ignore[arg-type]
                                            open_timeout=FORWARD_TIMEOUT_S, max_size=None)
    except (TimeoutError, OSError, websockets.WebSocketException) as exc:
        log.warning("relay to %s failed: %s", owner_url, exc)
        await websocket.close(1013, "the replica that holds this session did not answer")
        return

    async def client_to_owner() -> None:
        while True:
            message = await websocket.receive()
            if message["type"] == "websocket.disconnect":
                await upstream.close(int(message.get("code", 1000)))
                return
            await upstream.send(message["text"] if message.get("text") is not None else message["bytes"])

    async def owner_to_client() -> None:
        with contextlib.suppress(websockets.ConnectionClosed):
            async for frame in upstream:
                if isinstance(frame, str):
                    await websocket.send_text(frame)
                else:
                    await websocket.send_bytes(frame)
        if websocket.application_state == WebSocketState.CONNECTED:
            with contextlib.suppress(Exception):
                await websocket.close(upstream.close_code or 1011, upstream.close_reason or "")

    tasks = [asyncio.create_task(client_to_owner()), asyncio.create_task(owner_to_client())]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
        for outcome in await asyncio.gather(*tasks, return_exceptions=True):
            if isinstance(outcome, BaseException) and not isinstance(
                    outcome, (asyncio.CancelledError, WebSocketDisconnect, websockets.ConnectionClosed, RuntimeError)):
                log.warning("relay to %s ended with %r", owner_url, outcome)
        await upstream.close()
