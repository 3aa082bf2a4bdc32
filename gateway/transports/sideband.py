"""A sideband connection: `GET /v1/realtime?call_id=rtc_...` (WebSocket), as OpenAI has it. The
application's server watches a WebRTC call that a browser holds and steers it (session.update, tool
results, response.create) with its own API key, beside the browser's data channel: it gets every event
the session sends from when it connects, and its events go to the same session. A call held by another
replica is relayed there (ids name their replica)."""

from __future__ import annotations

import asyncio
import contextlib

from fastapi import WebSocket
from starlette.websockets import WebSocketDisconnect, WebSocketState

from gateway.auth import Principal
from gateway.forwarding import relay_websocket, replica_of
from gateway.protocol.errors import ApiError
from gateway.services import Services

CLOSE_TRY_AGAIN = 1013


async def serve_sideband(websocket: WebSocket, svc: Services, principal: Principal, call_id: str,
                         subprotocol: str | None) -> None:
    """Raises ApiError before it serves (the caller reports it); afterwards the connection is its own."""
    if principal.secret is not None:
        raise ApiError("invalid_api_key", "A sideband connection uses an API key, not a client secret.", status=401)
    call = svc.calls.get(call_id)
    if call is None and (owner := await svc.owner_url(replica_of(call_id))) is not None:
        await relay_websocket(websocket, owner, subprotocol)
        return
    # Another key's call is as unknown as a wrong id.
    seat = svc.sessions.get(call.session) if call is not None else None
    if call is None or seat is None or seat.key_id != principal.key_id:
        raise ApiError("call_not_found", f"No active call '{call_id}'.", "call_id", status=404)
    session = call.session
    tap = session.outbox.tap()

    async def to_client() -> None:
        while (wire := await tap.next()) is not None:
            await websocket.send_text(wire)

    async def from_client() -> None:
        while True:
            message = await websocket.receive()
            if message["type"] == "websocket.disconnect":
                return
            if message.get("text") is None:
                session.send_error(ApiError("invalid_event", "Events are JSON text frames; a binary frame was sent."))
                continue
            await session.receive(message["text"])

    tasks = [asyncio.create_task(to_client(), name=f"sideband writer {call_id}"),
             asyncio.create_task(from_client(), name=f"sideband reader {call_id}")]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        session.outbox.untap(tap)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if websocket.application_state == WebSocketState.CONNECTED:
            code, reason = (CLOSE_TRY_AGAIN, "slow consumer: events were not read") if tap.overflowed else (1000, "")
            with contextlib.suppress(WebSocketDisconnect, RuntimeError, OSError):
                await websocket.close(code, reason)
