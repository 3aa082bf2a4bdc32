"""POST /v1/live/sessions: a GPT-Live session over WebRTC, as `client.live.create(session=..., transport={"type":
"webrtc", "sdp": ...})` sends it: the SDP offer and the session's configuration in, its id and the SDP answer out.

The session starts as it is created (session.started is the data channel's first event; a session.start sent there
is refused). The user's audio comes in on the track; the assistant's goes out on it, paced by the track at 48 kHz
(OutboundAudioTrack), and its words follow it on the data channel (LiveFront.played): no audio is sent as events.
Events go both ways on the `oai-events` data channel, as for a Realtime call (openai.types.live names no label).
The session's `client.data_channel` capabilities restrict what an untrusted front end may send there (a refused
event is an error naming it) and be sent; an `info` event `data_channel_permissions` says which. A sideband
(live_sessions.py) is never restricted. There is no resume: the events channel's end is the session's.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field

from aiortc import RTCConfiguration, RTCPeerConnection
from aiortc.mediastreams import MediaStreamTrack
from aiortc.rtcdatachannel import RTCDataChannel
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from gateway.api.caller import CallerOrClientSecret
from gateway.api.http_bodies import read_body
from gateway.api.openapi import error_responses
from gateway.api.services import Services, services
from gateway.api.session_registry import SessionRegistry
from gateway.api.transports.channel import run_session
from gateway.api.transports.live_factory import feed_history, open_live, require_live_config
from gateway.api.transports.live_sessions import LiveEntry, LiveRegistry
from gateway.api.transports.webrtc import (
    EVENTS_CHANNEL,
    MAX_SDP_BYTES,
    PLAYOUT_RATE,
    Call,
    CallIndex,
    DataChannel,
    answer_offer,
    digest,
    ice_servers,
    validate_offer,
)
from gateway.platform.auth import Principal, bearer_token
from gateway.platform.session_seats import Seat
from gateway.protocol.errors import ApiError
from gateway.protocol.live_media import DataChannelPermissions, LiveCreate, decode_live_create, peek_event
from gateway.realtime.live_audio import LiveAudioStream
from gateway.realtime.live_front import LiveFront
from gateway.realtime.session_hub import Attachment
from media.frames import AudioChunk
from media.tracks import InboundAudioReader, OutboundAudioTrack

router = APIRouter()

# Sent on the data channel by the front end's own means, never as events.
MEDIA_ONLY = {
    "session.start": ("session_already_started", "A WebRTC session starts as it is created (POST /v1/live/sessions); "
                      "do not send session.start on its data channel."),
    "session.input_audio.append": ("unsupported_event", "A WebRTC session hears its audio track; "
                                   "session.input_audio.append is for a Live WebSocket."),
    "session.output_audio.fixture.play": ("unsupported_event", "An audio fixture is played from the primary "
                                          "WebSocket or a sideband, not from a WebRTC front end."),
}


class PermittedChannel:
    """A data channel that carries only the server events its front end may receive."""

    kind = "datachannel"

    def __init__(self, channel: DataChannel, permissions: DataChannelPermissions) -> None:
        self._channel = channel
        self._permissions = permissions

    async def receive(self) -> str | bytes:
        return await self._channel.receive()

    async def send(self, wire: str) -> None:
        if self._permissions.allows_server(json.loads(wire)):
            await self._channel.send(wire)

    async def close(self, code: int, reason: str) -> None:
        await self._channel.close(code, reason)


@dataclass
class LiveCall(Call):
    """A Live session's call: its Live front hears the track and takes the data channel's events."""

    front: LiveFront = field(kw_only=True)
    permissions: DataChannelPermissions = field(kw_only=True)

    def attach_channel(self, channel: RTCDataChannel) -> None:
        if channel.label != EVENTS_CHANNEL or self.ended.is_set():
            return
        if self.tasks:  # one events channel: the session's events are not split between two
            channel.close()
            return
        events = DataChannel(channel)

        async def end() -> None:
            self.end()

        self.tasks.append(asyncio.create_task(
            run_session(PermittedChannel(events, self.permissions) if self.permissions.restricted else events,
                        self.session, self.session.outbox.attach(), attachment=Attachment(), hub=None, end=end,
                        receive=self._from_front_end),
            name=f"live datachannel {self.id}"))

    def attach_track(self, track: MediaStreamTrack) -> None:
        if track.kind != "audio" or self.reader is not None:
            return

        def on_chunk(chunk: AudioChunk) -> None:
            try:
                self.front.hear(chunk)
            except ApiError as error:
                self.session.send_error(error)

        # At the playout's rate, the front's input rate (LiveAudioStream): a sideband hears the track's own audio.
        self.reader = InboundAudioReader(track, on_chunk, out_rate=PLAYOUT_RATE, on_end=self.ended.set).start()

    async def supervise(self, sessions: SessionRegistry, calls: CallIndex) -> None:
        try:
            await super().supervise(sessions, calls)
        finally:
            await self.front.close()

    async def _from_front_end(self, raw: str | bytes) -> None:
        kind, event_id = peek_event(raw, max_bytes=self.session.settings.max_event_bytes)
        if kind in MEDIA_ONLY:
            code, message = MEDIA_ONLY[kind]
            self.session.send_error(ApiError(code, message, "type", event_id=event_id))
        elif kind is not None and not self.permissions.allows_client(kind):
            self.session.send_error(ApiError(
                "event_not_permitted", f"'{kind}' is not among this data channel's allowed_client_events "
                "(session.client.data_channel).", "type", event_id=event_id))
        else:
            await self.front.receive(raw)


@router.post("/v1/live/sessions", responses=error_responses(400, 401, 404, 413, 429, 503))
async def create_live_session(request: Request, caller: CallerOrClientSecret) -> JSONResponse:
    svc = services(request)
    svc.runtime.require_ready()
    if not svc.runtime.voice_ready:
        raise ApiError("voice_unavailable", "Live WebRTC sessions need the voice models, which are not loaded.",
                       status=503)
    raw = await read_body(request, MAX_SDP_BYTES + svc.settings.max_event_bytes)
    create = decode_live_create(raw, max_bytes=svc.settings.max_event_bytes)
    require_live_config(svc, create.session)
    try:
        validate_offer(create.sdp)
    except ApiError as error:
        error.param = "transport.sdp"
        raise
    async with svc.sessions.seat(caller.key_id) as seat:  # 503 or 429 before any SDP work
        answer, session_id = await _set_up(svc, request, caller.principal, create, seat)
    return JSONResponse({"session": {"id": session_id}, "transport": {"type": "webrtc", "sdp": answer}},
                        headers=caller.headers)


async def _set_up(svc: Services, request: Request, principal: Principal, create: LiveCreate,
                  seat: Seat) -> tuple[str, str]:
    """The session and its peer connection set up on `seat`, started; its SDP answer and id."""
    session, front = open_live(svc, create.session, getattr(request.state, "request_id", None),
                               LiveAudioStream("audio/pcm", PLAYOUT_RATE), principal.key_id, wire_audio=False)
    pc = RTCPeerConnection(RTCConfiguration(iceServers=ice_servers(svc.settings)))
    call = LiveCall(id=session.id, pc=pc, session=session, playout=front.playout, front=front,
                    permissions=create.permissions)
    pc.on("datachannel", call.attach_channel)
    pc.on("track", call.attach_track)
    call.follow_connection()
    track = OutboundAudioTrack(front.playout, on_event=front.playout_event, on_frame=front.played)
    await answer_offer(svc, pc, session, track, create.sdp, principal, seat, sdp_param="transport.sdp")
    session.start()  # session.started: the data channel's first event
    feed_history(session, create.session)
    if create.session.client is not None:
        session.outbox.send({"type": "info", "code": "data_channel_permissions",
                             "message": create.permissions.describe()})
    registry: LiveRegistry = request.app.state.live_sessions
    token = bearer_token(request.headers.get("authorization"))
    registry.add(LiveEntry(session, front, principal.key_id, call=call,
                           secret_digest=digest(token) if principal.secret is not None else None))
    svc.sessions.in_background(call.supervise(svc.sessions, registry), f"live call {session.id}")
    return pc.localDescription.sdp, session.id
