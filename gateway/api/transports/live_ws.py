"""GET /v1/live/sessions: OpenAI's GPT-Live API over a WebSocket, on the same realtime core as /v1/realtime.

The client's first event is `session.start` (its model, instructions, audio format and voice, earlier history);
the session then runs as a Realtime one whose events LiveTranslator says in Live's words and whose client events
LiveFront takes (gateway/realtime/live_front.py). There is no resume: a dropped connection ends the session.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from typing import Any

from fastapi import APIRouter, WebSocket

from gateway.api.services import Services, services
from gateway.api.transports.channel import ChannelClosed, run_session
from gateway.api.transports.live_factory import feed_history, open_live, require_live_config
from gateway.api.transports.live_sessions import LiveEntry, refuse, refuse_connection
from gateway.api.transports.websocket_channel import WebSocketChannel
from gateway.platform.auth import bearer_token, token_from_subprotocols
from gateway.platform.event_log import log_event
from gateway.protocol.codec import encode_server_event
from gateway.protocol.errors import ApiError
from gateway.protocol.live_events import (
    LiveSessionConfig,
    SessionStart,
    decode_live_event,
)
from gateway.realtime.live_audio import LiveAudioStream
from gateway.realtime.live_front import LiveFront
from gateway.realtime.live_wire import live_error
from gateway.realtime.session import RealtimeSession

log = logging.getLogger(__name__)
router = APIRouter()

START_TIMEOUT_S = 30.0  # a connection that never sends session.start is closed


@router.websocket("/v1/live/sessions")
async def live_websocket(websocket: WebSocket) -> None:
    svc = services(websocket)
    subprotocols = [p.strip() for p in websocket.headers.get("sec-websocket-protocol", "").split(",") if p.strip()]
    token = bearer_token(websocket.headers.get("authorization")) or token_from_subprotocols(subprotocols)
    request_id: str | None = getattr(websocket.state, "request_id", None)
    # The seat (sessions.seat) is the session's once it opens; given back as the set-up ends otherwise.
    async with contextlib.AsyncExitStack() as setting_up:
        try:
            principal = (await svc.gate.authorize(token, allow_ephemeral=True)).principal
            svc.runtime.require_ready()
            seat = await setting_up.enter_async_context(svc.sessions.seat(principal.key_id))
        except ApiError as error:
            await refuse_connection(websocket, error, "live.session.refused")
            return
        await websocket.accept()
        channel = WebSocketChannel(websocket, kind="live")
        session: RealtimeSession | None = None
        try:
            start = await _session_start(channel, svc)
            if start is None:
                return
            session, front = _open(svc, start.session, request_id, principal.key_id)
            attachment = await svc.sessions.open_session(session, principal, seat)  # spends a client secret
        except ApiError as error:
            if session is not None:
                await session.close()
            log_event("live.session.refused", request_id=request_id, code=error.code)
            await refuse(websocket, error)
            return
    reader = session.outbox.attach()
    session.start()
    feed_history(session, start.session)
    websocket.app.state.live_sessions.add(LiveEntry(session, front, principal.key_id))  # for a sideband, a hangup
    front.start()

    async def end() -> None:
        await front.close()
        await svc.sessions.end_session(session)

    try:
        await run_session(channel, session, reader, attachment=attachment, hub=None, end=end, receive=front.receive)
    finally:
        await front.close()


async def _session_start(channel: WebSocketChannel, svc: Services) -> SessionStart | None:
    """The client's session.start; anything before it is answered with an error. None: the client went."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        try:
            raw = await asyncio.wait_for(channel.receive(), max(0.0, deadline - time.monotonic()))
        except ChannelClosed:
            return None
        except TimeoutError:
            raise ApiError("session_not_started", f"No session.start within {START_TIMEOUT_S:.0f} s.") from None
        try:
            event = decode_live_event(raw, max_bytes=svc.settings.max_event_bytes)
            if not isinstance(event, SessionStart):
                raise ApiError("session_not_started", "Send session.start first and wait for session.started.",
                               "type", event_id=event.event_id)
        except ApiError as error:
            if error.code == "session_not_started" or error.status >= 500:
                await channel.send(_wire(live_error(error.body())))
                continue
            raise
        require_live_config(svc, event.session, event.event_id)
        return event


def _open(svc: Services, config: LiveSessionConfig, request_id: str | None,
          owner: str) -> tuple[RealtimeSession, LiveFront]:
    """The realtime session a Live one runs on, its playout at the client's rate, and its Live front."""
    fmt = config.audio.format if config.audio is not None and config.audio.format is not None else None
    audio = LiveAudioStream(fmt.type, fmt.rate) if fmt is not None else LiveAudioStream("audio/pcm", 24000)
    return open_live(svc, config, request_id, audio, owner)


def _wire(event: dict[str, Any]) -> str:
    return encode_server_event({"event_id": f"event_{secrets.token_hex(8)}", **event})
