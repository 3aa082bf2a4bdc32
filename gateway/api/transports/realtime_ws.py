"""GET /v1/realtime: the Realtime API over a WebSocket, one JSON event per text frame."""

from __future__ import annotations

import contextlib
import logging
import secrets

from fastapi import APIRouter, WebSocket
from starlette.datastructures import QueryParams

from gateway.api.forwarding import relay_websocket, replica_of
from gateway.api.http_errors import error_response
from gateway.api.services import Services, services
from gateway.api.transports.channel import CLOSE_TRY_AGAIN, attach, run_session
from gateway.api.transports.sideband import serve_sideband
from gateway.api.transports.websocket_channel import WebSocketChannel
from gateway.platform.auth import bearer_token, token_from_subprotocols
from gateway.platform.event_log import log_event
from gateway.platform.session_seats import Seat
from gateway.protocol.errors import ApiError
from gateway.protocol.session_config import with_intent
from gateway.realtime.outbox import OutboxReader
from gateway.realtime.recorder import attach_stored_conversation
from gateway.realtime.session import RealtimeSession
from gateway.realtime.session_hub import Attachment
from gateway.realtime.speech_out import WebSocketSpeech

log = logging.getLogger(__name__)
router = APIRouter()

# Close codes: 1008 policy violation (auth), 1013 try again later (the others: channel.py).
CLOSE_POLICY = 1008
# Refusals known before the upgrade that are answered over HTTP: a full or draining replica, a key at its
# session bound or rate limit, models not ready.
REFUSED_BEFORE_UPGRADE = (429, 503)


@router.websocket("/v1/realtime")
async def realtime_websocket(websocket: WebSocket) -> None:
    svc = services(websocket)
    subprotocols = [p.strip() for p in websocket.headers.get("sec-websocket-protocol", "").split(",") if p.strip()]
    token = bearer_token(websocket.headers.get("authorization")) or token_from_subprotocols(subprotocols)
    accept_subprotocol = "realtime" if "realtime" in subprotocols else None
    request_id: str | None = getattr(websocket.state, "request_id", None)
    query = websocket.query_params
    call_id, resume_token = query.get("call_id"), query.get("resume")
    new_session = call_id is None and resume_token is None
    # The seat of a new session (sessions.seat) is the session's once it opens; given back as the set-up ends
    # otherwise.
    async with contextlib.AsyncExitStack() as setting_up:
        seat: Seat | None = None
        try:
            # Not the caller dependency: the token may come in a subprotocol, and a refusal is an HTTP answer or a
            # close, not a JSON error (the rate-limit headers have no answer to go on).
            principal = (await svc.gate.authorize(token, allow_ephemeral=True)).principal
            if new_session:
                if (model := query.get("model")) is not None:
                    svc.runtime.require_model(model)
                svc.runtime.require_ready()
                # 503 or 429 past a session bound
                seat = await setting_up.enter_async_context(svc.sessions.seat(principal.key_id))
        except ApiError as error:
            log_event("realtime.session.refused", request_id=request_id, transport="websocket", code=error.code)
            if error.status in REFUSED_BEFORE_UPGRADE:
                # An HTTP answer, not an upgrade: a router retries a 503 on another replica, a client sees the
                # status.
                await websocket.send_denial_response(error_response(error))
            else:  # said in an `error` event (clients show it), then the close
                await websocket.accept(subprotocol=accept_subprotocol)
                await _refuse(websocket, error)
            return
        await websocket.accept(subprotocol=accept_subprotocol)
        fresh: RealtimeSession | None = None  # a new session, closed again if it is refused
        try:
            if call_id is not None:  # a sideband connection to a call
                await serve_sideband(websocket, svc, principal, call_id)
                return
            if resume_token is not None and (owner := await svc.stores.owner_url(replica_of(resume_token))) is not None:
                # The session lives on another replica (the router sent the resume here): relay to its owner.
                await relay_websocket(websocket, owner)
                return
            if resume_token is not None:
                session, attachment, reader = _resume(svc, resume_token, principal.key_id, query)
            else:
                assert seat is not None
                session = fresh = RealtimeSession(
                    svc.runtime,
                    svc.settings,
                    transport="websocket",
                    speech_factory=WebSocketSpeech.create,
                    initial_config=with_intent(principal.ephemeral_session, query.get("intent")),
                    request_id=request_id,
                    session_id=principal.ephemeral_session_id,
                )
                if (stored := query.get("conversation")) is not None:
                    await attach_stored_conversation(session, svc.stores.store, principal.key_id, stored)
                attachment = await svc.sessions.open_session(session, principal, seat)  # spends a client secret
                reader = session.outbox.attach()
                session.start()
        except ApiError as error:
            if fresh is not None:
                await fresh.close()  # its stored conversation's recorder, if it had one
            log_event("realtime.session.refused", request_id=request_id, transport="websocket", code=error.code)
            await _refuse(websocket, error)
            return
    await run_session(WebSocketChannel(websocket), session, reader, attachment=attachment, hub=svc.sessions.hub,
                      end=lambda: svc.sessions.end_session(session))


async def _refuse(websocket: WebSocket, error: ApiError) -> None:
    """A refusal said on the accepted connection: an `error` event (clients show it), then the close (1008 for
    auth and what is not found, 1013 try again later)."""
    await websocket.send_json({"type": "error", "event_id": f"event_{secrets.token_hex(8)}", "error": error.body()})
    await websocket.close(CLOSE_POLICY if error.status in (401, 403, 404) else CLOSE_TRY_AGAIN, error.code)


def _resume(
    svc: Services, token: str, key_id: str, query: QueryParams
) -> tuple[RealtimeSession, Attachment, OutboxReader]:
    """Takes over a running session: the events after `last_sequence` come first, then the live stream."""
    raw = query.get("last_sequence")
    try:
        last_sequence = int(raw) if raw is not None else None
    except ValueError:
        raise ApiError("invalid_value", "last_sequence must be an integer.", "last_sequence") from None
    session, attachment = svc.sessions.hub.take(token, key_id)
    try:
        reader = attach(session, last_sequence)
    except ApiError:
        svc.sessions.hub.park(session, attachment)  # still resumable, with a last_sequence it can replay from
        raise
    log_event("realtime.session.resumed", session_id=session.id, transport="websocket", last_sequence=last_sequence)
    return session, attachment, reader
