"""GET /v1/live/sessions: OpenAI's GPT-Live API over a WebSocket, on the same realtime core as /v1/realtime.

The client's first event is `session.start` (its model, instructions, audio format and voice, earlier history);
the session then runs as a Realtime one whose events LiveTranslator says in Live's words and whose client events
LiveFront takes (gateway/realtime/live_front.py). There is no resume: a dropped connection ends the session.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from typing import Any

from fastapi import APIRouter, WebSocket

from gateway.api.services import Services, services
from gateway.api.transports.channel import ChannelClosed, run_session
from gateway.api.transports.live_sessions import LiveEntry, refuse, refuse_connection
from gateway.api.transports.responses_http import response_deps
from gateway.api.transports.websocket_channel import WebSocketChannel
from gateway.generation.response_run import ResponseRun
from gateway.platform.auth import bearer_token, token_from_subprotocols
from gateway.platform.config import LiveDelegate
from gateway.platform.event_log import log_event
from gateway.platform.model_names import openai_live_model_names
from gateway.platform.session_seats import Seat
from gateway.protocol.codec import encode_server_event
from gateway.protocol.errors import ApiError
from gateway.protocol.live_events import (
    LiveSessionConfig,
    ResponsesDelegation,
    SessionStart,
    decode_live_event,
)
from gateway.protocol.responses import ResponseCreateRequest
from gateway.realtime.conversation import Item, new_id
from gateway.realtime.inputs import ItemCreated
from gateway.realtime.live_audio import LiveAudio
from gateway.realtime.live_delegation import DELEGATE, DELEGATE_TOOL, check_backend
from gateway.realtime.live_front import FRAME_MS, LiveFront
from gateway.realtime.live_wire import LiveTranslator, live_error
from gateway.realtime.outbox import Outbox
from gateway.realtime.session import RealtimeSession
from gateway.realtime.speech_out import PlayoutSpeech
from media.playout import PlayoutBuffer

log = logging.getLogger(__name__)
router = APIRouter()

START_TIMEOUT_S = 30.0  # a connection that never sends session.start is closed


@router.websocket("/v1/live/sessions")
async def live_websocket(websocket: WebSocket) -> None:
    svc = services(websocket)
    subprotocols = [p.strip() for p in websocket.headers.get("sec-websocket-protocol", "").split(",") if p.strip()]
    token = bearer_token(websocket.headers.get("authorization")) or token_from_subprotocols(subprotocols)
    request_id: str | None = getattr(websocket.state, "request_id", None)
    seat: Seat | None = None
    try:
        principal = (await svc.gate.authorize(token, allow_ephemeral=True)).principal
        svc.runtime.require_ready()
        seat = await svc.sessions.take_seat(principal.key_id)
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
        seat = None  # the session's now
    except ApiError as error:
        if session is not None:
            await session.close()
        log_event("live.session.refused", request_id=request_id, code=error.code)
        await refuse(websocket, error)
        return
    finally:
        if seat is not None:
            await svc.sessions.seats.give_back(seat)
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


def require_live_config(svc: Services, config: LiveSessionConfig, event_id: str | None = None) -> None:
    """What session.start's checks cannot know alone: the model names this server answers to, and a Responses
    delegation's settings, checked as the Responses request they become."""
    if config.model not in openai_live_model_names() and config.model not in svc.runtime.model_names:
        raise ApiError("model_not_found", f"Unknown model '{config.model[:100]}'. This server has "
                       f"'{svc.settings.model_name}' (gpt-live-1 and gpt-live-1.1 name it too).", "session.model",
                       status=404, event_id=event_id)
    if isinstance(config.delegation, ResponsesDelegation):
        try:
            check_backend(config.delegation.responses)
            svc.runtime.require_model(str(config.delegation.responses["model"]), "session.delegation.responses.model")
        except ApiError as error:
            error.event_id = event_id
            raise


def _open(svc: Services, config: LiveSessionConfig, request_id: str | None,
          owner: str) -> tuple[RealtimeSession, LiveFront]:
    """The realtime session a Live one runs on, its playout at the client's rate, and its Live front."""
    fmt = config.audio.format if config.audio is not None and config.audio.format is not None else None
    audio = LiveAudio(fmt.type, fmt.rate) if fmt is not None else LiveAudio("audio/pcm", 24000)
    return open_live(svc, config, request_id, audio, owner)


def open_live(svc: Services, config: LiveSessionConfig, request_id: str | None, audio: LiveAudio, owner: str, *,
              wire_audio: bool = True) -> tuple[RealtimeSession, LiveFront]:
    """A Live session on the realtime core, its playout at `audio`'s rate (WebRTC: the track's, and no audio
    format on the wire), and its Live front."""
    playout = PlayoutBuffer(audio.rate, audio.rate * FRAME_MS // 1000)
    started_at = time.monotonic()

    def clock_ms() -> int:
        return int((time.monotonic() - started_at) * 1000)

    translator = LiveTranslator(config, config.model, clock_ms, wire_audio=wire_audio)
    session = RealtimeSession(
        svc.runtime, svc.settings, transport="live", speech_factory=PlayoutSpeech.create,
        initial_config=_realtime_config(config, svc.settings.live_delegate), request_id=request_id,
        outbox=Outbox(numbered=False), translate=translator,
        # The id names this replica, so that another replica can pass its sideband and hangup on to it.
        session_id=new_id(f"sess_{svc.settings.replica_id}"))
    session.attach_playout(playout)

    async def prepare(request: ResponseCreateRequest) -> ResponseRun:
        """A delegated task's Responses request, run by the gateway's own Responses service for the session's key."""
        svc.runtime.require_model(request.model, "session.delegation.responses.model")
        return await ResponseRun.prepare(response_deps(svc, owner), request, owner)

    return session, LiveFront(session, translator, audio, playout, started_at, delegation=config.delegation,
                              prepare=prepare)


def _realtime_config(config: LiveSessionConfig, delegate: LiveDelegate) -> dict[str, Any]:
    """The Realtime session a Live one is: spoken replies, the gateway's own turn-taking (semantic_vad: the
    end-of-turn models, a backchannel does not interrupt), its voice; with a delegation, its tool (`delegate`:
    --live-delegate)."""
    realtime: dict[str, Any] = {"output_modalities": ["audio"],
                                "audio": {"input": {"turn_detection": {"type": "semantic_vad"}}}}
    if config.instructions is not None and config.instructions.strip():
        realtime["instructions"] = config.instructions
    output = config.audio.output if config.audio is not None else None
    if output is not None and isinstance(output.voice, str):
        realtime["audio"]["output"] = {"voice": output.voice}
    if config.delegation is not None:
        # The live model hands tasks on with its one tool. Only when asked (OpenAI's Live gives it to every
        # session): a reply that may be a call is not spoken ahead of the turn's end, which costs a voice turn
        # 250-400 ms of first audio here, and the small embedded model never delegates well.
        realtime["tools"] = [DELEGATE_TOOL]
        # every_turn: the replies to the user's turns are the call (the voice's own replies choose none:
        # live_front.py).
        realtime["tool_choice"] = {"type": "function", "name": DELEGATE} if delegate == "every_turn" else "auto"
    return realtime


def feed_history(session: RealtimeSession, config: LiveSessionConfig) -> None:
    """session.start's `input` into the started session: the conversation so far, as text (a developer's message
    is a system one). Past the conversation's bounds the rest is refused with an error, and the session goes on."""
    for message in config.input or []:
        role = "system" if message.role == "developer" else message.role
        kind = "output_text" if role == "assistant" else "input_text"
        item = Item(id=new_id("item"), type="message", role=role, status="completed",
                    content=[{"type": kind, "text": message.content[0].text}])
        try:
            session.feed(ItemCreated(item))
        except ApiError as error:
            session.send_error(error)
            return


def _wire(event: dict[str, Any]) -> str:
    return encode_server_event({"event_id": f"event_{secrets.token_hex(8)}", **event})
