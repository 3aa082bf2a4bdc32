"""A sideband connection: `GET /v1/realtime?call_id=rtc_...` (WebSocket), as OpenAI has it. The
application's server watches a WebRTC call that a browser holds and steers it (session.update, tool
results, response.create) with its own API key, beside the browser's data channel: it gets every event
the session sends from when it connects, and its events go to the same session. A call held by another
replica is relayed there (ids name their replica)."""

from __future__ import annotations

from fastapi import WebSocket

from gateway.api.forwarding import relay_websocket, replica_of
from gateway.api.services import Services
from gateway.api.transports.channel import run_session
from gateway.api.transports.websocket_channel import WebSocketChannel
from gateway.platform.auth import Principal
from gateway.protocol.errors import ApiError


async def serve_sideband(websocket: WebSocket, svc: Services, principal: Principal, call_id: str) -> None:
    """Raises ApiError before it serves (the caller reports it); afterwards the connection is its own."""
    if principal.secret is not None:
        raise ApiError("invalid_api_key", "A sideband connection uses an API key, not a client secret.", status=401)
    call = websocket.app.state.calls.get(call_id)
    if call is None and (owner := await svc.stores.owner_url(replica_of(call_id))) is not None:
        await relay_websocket(websocket, owner)
        return
    # Another key's call is as unknown as a wrong id.
    seat = svc.sessions.live.get(call.session) if call is not None else None
    if call is None or seat is None or seat.key_id != principal.key_id:
        raise ApiError("call_not_found", f"No active call '{call_id}'.", "call_id", status=404)
    session = call.session
    tap = session.outbox.tap()
    try:  # a watcher: its end is its own, the call goes on
        await run_session(WebSocketChannel(websocket, "sideband"), session, tap, attachment=None, hub=None, end=None)
    finally:
        session.outbox.untap(tap)
