"""GET /v1/realtime: the Realtime API over a WebSocket, one JSON event per text frame."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets

from fastapi import APIRouter, WebSocket
from starlette.datastructures import QueryParams
from starlette.websockets import WebSocketDisconnect, WebSocketState

from gateway.auth import bearer_token, token_from_subprotocols
from gateway.event_log import log_event
from gateway.forwarding import relay_websocket, replica_of
from gateway.http_errors import error_response
from gateway.outbox import OutboxReader, ReplayUnavailable, SlowConsumer
from gateway.protocol.errors import ApiError
from gateway.protocol.session_config import with_intent
from gateway.realtime_store import attach_stored_conversation
from gateway.services import Services
from gateway.session import RealtimeSession
from gateway.session_hub import Attachment
from gateway.session_seats import Seat
from gateway.speech_out import WebSocketSpeech
from gateway.transports.sideband import serve_sideband

log = logging.getLogger(__name__)
router = APIRouter()

# Close codes: 1008 policy violation (auth), 1011 server error, 1013 try again later.
CLOSE_POLICY = 1008
CLOSE_TRY_AGAIN = 1013
CLOSE_SERVER_ERROR = 1011
CLOSE_RESUMED_ELSEWHERE = 4000  # application code: another connection resumed this session
# Refusals known before the upgrade that are answered over HTTP: a full or draining replica, a key at its
# session bound or rate limit, models not ready.
REFUSED_BEFORE_UPGRADE = (429, 503)


@router.websocket("/v1/realtime")
async def realtime_websocket(websocket: WebSocket) -> None:
    svc: Services = websocket.app.state.services
    subprotocols = [p.strip() for p in websocket.headers.get("sec-websocket-protocol", "").split(",") if p.strip()]
    token = bearer_token(websocket.headers.get("authorization")) or token_from_subprotocols(subprotocols)
    accept_subprotocol = "realtime" if "realtime" in subprotocols else None
    request_id: str | None = getattr(websocket.state, "request_id", None)
    query = websocket.query_params
    call_id, resume_token = query.get("call_id"), query.get("resume")
    new_session = call_id is None and resume_token is None
    seat: Seat | None = None
    try:
        principal = await svc.auth.authenticate(token, allow_ephemeral=True)
        await svc.limiter.check(principal.key_id)
        if new_session:
            if (model := query.get("model")) is not None:
                svc.require_model(model)
            svc.require_ready()
            seat = await svc.take_seat(principal.key_id)  # 503 or 429 past a session bound
    except ApiError as error:
        log_event("realtime.session.refused", request_id=request_id, transport="websocket", code=error.code)
        if error.status in REFUSED_BEFORE_UPGRADE:
            # An HTTP answer, not an upgrade: a router retries a 503 on another replica, a client sees the status.
            await websocket.send_denial_response(error_response(error))
        else:  # said in an `error` event (clients show it), then the close
            await websocket.accept(subprotocol=accept_subprotocol)
            await _refuse(websocket, error)
        return
    await websocket.accept(subprotocol=accept_subprotocol)
    fresh: RealtimeSession | None = None  # a new session, closed again if it is refused
    try:
        if call_id is not None:  # a sideband connection to a call
            await serve_sideband(websocket, svc, principal, call_id, accept_subprotocol)
            return
        if resume_token is not None and (owner := await svc.owner_url(replica_of(resume_token))) is not None:
            # The session lives on another replica (the router sent the resume here): relay to its owner.
            await relay_websocket(websocket, owner, accept_subprotocol)
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
                await attach_stored_conversation(session, svc.store, principal.key_id, stored)
            attachment = await svc.open_session(session, principal, seat)  # spends a client secret
            seat = None  # the session's now: given back when it ends
            reader = session.outbox.attach()
            session.start()
    except ApiError as error:
        if fresh is not None:
            await fresh.close()  # its stored conversation's recorder, if it had one
        log_event("realtime.session.refused", request_id=request_id, transport="websocket", code=error.code)
        await _refuse(websocket, error)
        return
    finally:
        if seat is not None:  # the session was not set up
            await svc.seats.give_back(seat)
    await _attach(websocket, svc, session, attachment, reader)


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
    session, attachment = svc.hub.take(token, key_id)
    try:
        reader = session.outbox.attach(last_sequence)
    except ReplayUnavailable as exc:
        svc.hub.park(session, attachment)  # still resumable, with a last_sequence it can replay from
        raise ApiError("resume_gap", str(exc), "last_sequence") from None
    log_event("realtime.session.resumed", session_id=session.id, transport="websocket", last_sequence=last_sequence)
    return session, attachment, reader


async def _attach(
    websocket: WebSocket, svc: Services, session: RealtimeSession, attachment: Attachment, reader: OutboxReader
) -> None:
    """Carries the session's events both ways until the connection ends, another connection takes the
    session over, or the session ends. A connection that drops without a close frame parks the session
    for its resume window instead of ending it."""
    writer = asyncio.create_task(_write_events(websocket, session, reader), name=f"ws writer {session.id}")
    receiver = asyncio.create_task(_read_events(websocket, session), name=f"ws reader {session.id}")
    superseded = asyncio.create_task(attachment.superseded.wait(), name=f"ws superseded {session.id}")
    try:
        await asyncio.wait({writer, receiver, superseded}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:  # the server is shutting down; it closes the session itself
        for task in (writer, receiver):
            task.cancel()
        await asyncio.gather(writer, receiver, return_exceptions=True)
        raise
    finally:
        superseded.cancel()
        await asyncio.gather(superseded, return_exceptions=True)
    if not receiver.done():
        # The writer stopped (the peer is gone, or the session is over) or another connection took the
        # session: closing the socket ends the reader between two events, never inside one.
        if attachment.superseded.is_set():
            await _close(websocket, CLOSE_RESUMED_ELSEWHERE, "the session was resumed on another connection")
        else:
            await _close(websocket, *session.close_frame)
        await _join(receiver)
    if attachment.superseded.is_set():
        await _stop(writer)
        return
    if _dropped(receiver, writer) and svc.hub.park(session, attachment):
        await _stop(writer)
        log_event("realtime.session.parked", session_id=session.id, window_s=svc.settings.resume_window_s)
        return
    if receiver.done() and not receiver.cancelled() and (error := receiver.exception()) is not None:
        if isinstance(error, SlowConsumer):
            log.warning("closing session %s: %s", session.id, error)
        else:
            log.error("session %s: reading its events failed", session.id, exc_info=error)
    await svc.end_session(session)
    await _drain(writer)
    await _close(websocket, *session.close_frame)


def _dropped(receiver: asyncio.Task[int], writer: asyncio.Task[bool]) -> bool:
    """Whether the connection went away without the client closing it (no close frame: 1005, 1006),
    as the reader or the writer found out first."""
    if receiver.done() and not receiver.cancelled() and receiver.exception() is None:
        return receiver.result() not in (1000, 1001)
    return writer.done() and not writer.cancelled() and writer.exception() is None and writer.result()


async def _stop(task: asyncio.Task[bool]) -> None:
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


async def _join(receiver: asyncio.Task[int], timeout_s: float = 5.0) -> None:
    """Waits for the reader to see the close; a peer that never answers it is cut off."""
    await asyncio.wait({receiver}, timeout=timeout_s)
    if not receiver.done():
        receiver.cancel()
    await asyncio.gather(receiver, return_exceptions=True)


async def _close(websocket: WebSocket, code: int, reason: str) -> None:
    if websocket.application_state == WebSocketState.CONNECTED:
        with contextlib.suppress(Exception):
            await websocket.close(code, reason)


async def _read_events(websocket: WebSocket, session: RealtimeSession) -> int:
    """Hands the client's events to the session until the client goes; returns its close code."""
    while True:
        try:
            message = await websocket.receive()
        except WebSocketDisconnect as exc:
            return exc.code
        if message["type"] == "websocket.disconnect":
            return int(message.get("code", 1005))
        raw = message.get("text")
        if raw is None:
            # The Realtime API's events are JSON text frames; a binary frame is not one.
            session.send_error(ApiError("invalid_event", "Events are JSON text frames; a binary frame was sent."))
            continue
        await session.receive(raw)


async def _write_events(websocket: WebSocket, session: RealtimeSession, reader: OutboxReader) -> bool:
    """Sends the session's events until its outbox closes or another connection takes over. Returns
    True when the peer was found gone. A send that fails for another reason closes the outbox (and so
    the session) with the connection: a session is never left open and mute."""
    code, reason = session.close_frame
    try:
        while (wire := await reader.next()) is not None:
            await websocket.send_text(wire)
        if session.outbox.overflowed:
            code, reason = CLOSE_TRY_AGAIN, "slow consumer: events were not read"
    except (WebSocketDisconnect, OSError):
        return True
    except Exception:
        if WebSocketState.DISCONNECTED in (websocket.client_state, websocket.application_state):
            return True  # a send that raced the close (Starlette raises RuntimeError)
        log.exception("session %s: sending its events failed", session.id)
        code, reason = CLOSE_SERVER_ERROR, "server error"
        session.outbox.close()
    if code != 1000 and websocket.application_state == WebSocketState.CONNECTED:
        with contextlib.suppress(Exception):
            await websocket.close(code, reason)
    return False


async def _drain(writer: asyncio.Task[bool], timeout_s: float = 2.0) -> None:
    """Let queued events (the final `response.done`, errors) go out, then stop the writer."""
    done, _ = await asyncio.wait({writer}, timeout=timeout_s)
    if not done:
        writer.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await writer
