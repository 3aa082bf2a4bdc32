"""GET /v1/realtime: the Realtime API over a WebSocket, one JSON event per text frame."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets

from fastapi import APIRouter, WebSocket
from starlette.websockets import WebSocketDisconnect, WebSocketState

from gateway.auth import bearer_token, token_from_subprotocols
from gateway.event_log import log_event
from gateway.outbox import SlowConsumer
from gateway.protocol.errors import ApiError
from gateway.services import Services
from gateway.session import RealtimeSession
from gateway.speech_out import WebSocketSpeech

log = logging.getLogger(__name__)
router = APIRouter()

# Close codes: 1008 policy violation (auth), 1011 server error, 1013 try again later.
CLOSE_POLICY = 1008
CLOSE_TRY_AGAIN = 1013
CLOSE_SERVER_ERROR = 1011


@router.websocket("/v1/realtime")
async def realtime_websocket(websocket: WebSocket) -> None:
    svc: Services = websocket.app.state.services
    subprotocols = [p.strip() for p in websocket.headers.get("sec-websocket-protocol", "").split(",") if p.strip()]
    token = bearer_token(websocket.headers.get("authorization")) or token_from_subprotocols(subprotocols)
    accept_subprotocol = "realtime" if "realtime" in subprotocols else None
    request_id: str | None = getattr(websocket.state, "request_id", None)
    # Accepted first: a refusal is said in an `error` event (clients show it), then the close; and
    # nothing awaits between the session bounds' check and the session's count (open_session).
    await websocket.accept(subprotocol=accept_subprotocol)
    try:
        principal = svc.auth.authenticate(token, allow_ephemeral=True)
        svc.limiter.check(principal.key_id)
        model = websocket.query_params.get("model")
        if model is not None:
            svc.require_model(model)
        svc.require_ready()
        session = RealtimeSession(
            svc.runtime,
            svc.settings,
            transport="websocket",
            speech_factory=WebSocketSpeech.create,
            initial_config=principal.ephemeral_session,
            request_id=request_id,
        )
        svc.open_session(session, principal)  # 429 past a session bound; spends a client secret
    except ApiError as error:
        log_event("realtime.session.refused", request_id=request_id, transport="websocket", code=error.code)
        await websocket.send_json({"type": "error", "event_id": f"event_{secrets.token_hex(8)}", "error": error.body()})
        await websocket.close(CLOSE_POLICY if error.status in (401, 403, 404) else CLOSE_TRY_AGAIN, error.code)
        return
    session.start()
    writer = asyncio.create_task(_write_events(websocket, session), name=f"ws writer {session.id}")
    try:
        await _read_events(websocket, session)
    except SlowConsumer as exc:
        log.warning("closing session %s: %s", session.id, exc)
    finally:
        svc.close_session(session)
        await session.close()
        await _drain(writer)
        if websocket.application_state == WebSocketState.CONNECTED:
            with contextlib.suppress(Exception):
                await websocket.close()


async def _read_events(websocket: WebSocket, session: RealtimeSession) -> None:
    while True:
        try:
            message = await websocket.receive()
        except WebSocketDisconnect:
            return
        if message["type"] == "websocket.disconnect":
            return
        raw = message.get("text")
        if raw is None:
            # The Realtime API's events are JSON text frames; a binary frame is not one.
            session.send_error(ApiError("invalid_event", "Events are JSON text frames; a binary frame was sent."))
            continue
        await session.receive(raw)


async def _write_events(websocket: WebSocket, session: RealtimeSession) -> None:
    """Sends the session's events until its outbox closes. Whatever stops it, the connection is
    closed with it, so a session is never left open and mute (the reader then sees the close)."""
    code, reason = 1000, ""
    try:
        while (wire := await session.outbox.next()) is not None:
            await websocket.send_text(wire)
        if session.outbox.overflowed:
            code, reason = CLOSE_TRY_AGAIN, "slow consumer: events were not read"
    except (WebSocketDisconnect, OSError):
        return  # the peer is gone
    except Exception:
        if WebSocketState.DISCONNECTED in (websocket.client_state, websocket.application_state):
            return  # a send that raced the close (Starlette raises RuntimeError)
        log.exception("session %s: sending its events failed", session.id)
        code, reason = CLOSE_SERVER_ERROR, "server error"
    finally:
        session.outbox.close()
    if code != 1000 and websocket.application_state == WebSocketState.CONNECTED:
        with contextlib.suppress(Exception):
            await websocket.close(code, reason)


async def _drain(writer: asyncio.Task[None], timeout_s: float = 2.0) -> None:
    """Let queued events (the final `response.done`, errors) go out, then stop the writer."""
    done, _ = await asyncio.wait({writer}, timeout=timeout_s)
    if not done:
        writer.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await writer
