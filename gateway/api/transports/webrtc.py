"""WebRTC in OpenAI's browser flow: POST /v1/realtime/calls with an SDP offer, events on `oai-events`.

The only aiortc signalling code. Each call is owned by a supervisor task (kept in
SessionRegistry.background) that closes the session and the peer connection when the call ends.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import re
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from typing import Annotated, Any, Protocol

import aioice.ice
from aiortc import RTCConfiguration, RTCIceServer, RTCPeerConnection, RTCSessionDescription
from aiortc.mediastreams import MediaStreamTrack
from aiortc.rtcdatachannel import RTCDataChannel
from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import JSONResponse, Response
from starlette.datastructures import UploadFile
from starlette.formparsers import MultiPartException, MultiPartParser

from gateway.api.caller import authorized_after
from gateway.api.forwarding import forward_post, replica_of
from gateway.api.gate import Caller
from gateway.api.http_bodies import read_body
from gateway.api.openapi import error_responses, request_body
from gateway.api.services import Services, services
from gateway.api.session_registry import SessionRegistry
from gateway.api.transports.channel import ChannelClosed, Outcome, attach, run_session
from gateway.platform.auth import Principal, bearer_token
from gateway.platform.config import Settings
from gateway.platform.session_seats import Seat
from gateway.protocol.errors import ApiError
from gateway.protocol.json_input import decode_json
from gateway.realtime.conversation import new_id
from gateway.realtime.recorder import attach_stored_conversation
from gateway.realtime.session import RealtimeSession
from gateway.realtime.session_hub import Attachment, SessionHub
from gateway.realtime.speech_out import PlayoutSpeech
from media.playout import PlayoutBuffer
from media.tracks import InboundAudioReader, OutboundAudioTrack, shorten_audio_reorder_wait

log = logging.getLogger(__name__)
router = APIRouter()

EVENTS_CHANNEL = "oai-events"
PLAYOUT_RATE = 48000
FRAME_SAMPLES = PLAYOUT_RATE // 50  # 20 ms
CONNECT_TIMEOUT_S = 30.0
NO_CLOSE_FRAME = 1006
MAX_SDP_BYTES = 64 * 1024


def configure_ice(settings: Settings) -> None:
    """Offer the configured host addresses as ICE candidates (aioice never offers loopback itself)."""
    if settings.ice_host_addresses:
        offer_host_addresses(list(settings.ice_host_addresses))


def offer_host_addresses(addresses: list[str]) -> None:
    """Make this process's aioice offer exactly `addresses` (IPv4 and IPv6 as it asks for them)."""
    aioice.ice.get_host_addresses = lambda use_ipv4, use_ipv6: [  # type: ignore[assignment]
        address for address in addresses if (":" in address and use_ipv6) or (":" not in address and use_ipv4)
    ]


def ice_servers(settings: Settings) -> list[RTCIceServer]:
    servers = []
    for url in settings.ice_servers:
        # turn:user:pass@host:port -> credentials apart, as RTCIceServer wants them
        match = re.fullmatch(r"(turns?):([^:@]+):([^@]+)@(.+)", url)
        if match:
            scheme, user, password, host = match.groups()
            servers.append(RTCIceServer(urls=f"{scheme}:{host}", username=user, credential=password))
        else:
            servers.append(RTCIceServer(urls=url))
    return servers


class CallIndex(Protocol):
    """Where a call is found by its id, until it ends (CallRegistry; GPT-Live's sessions, live_sessions.py)."""

    def remove(self, call_id: str) -> None: ...


class RegisteredCall(Protocol):
    """A call the sideband watches and `hangup` ends: a WebRTC call (Call) or a carrier's stream (carrier_stream.py)."""

    @property
    def id(self) -> str: ...

    @property
    def session(self) -> RealtimeSession: ...

    @property
    def secret_digest(self) -> str | None: ...  # the client secret that opened it may hang it up

    def end(self) -> None: ...


class CallRegistry:
    """The live calls of this replica by id (the app's ``state.calls``), and a carrier's calls by the carrier's
    own id too. A call hangs up when its session ends, however it ended (the registry hooks the services'
    session end)."""

    def __init__(self, sessions: SessionRegistry) -> None:
        self._calls: dict[str, RegisteredCall] = {}
        self._aliases: dict[str, str] = {}  # a carrier's call id (Twilio's callSid) -> ours
        sessions.end_hooks.append(self._session_ended)

    def add(self, call: RegisteredCall, *, alias: str | None = None) -> None:
        self._calls[call.id] = call
        if alias is not None:
            self._aliases[alias] = call.id

    def get(self, call_id: str) -> RegisteredCall | None:
        return self._calls.get(self._aliases.get(call_id, call_id))

    def remove(self, call_id: str) -> None:
        self._calls.pop(call_id, None)
        for alias in [alias for alias, target in self._aliases.items() if target == call_id]:
            del self._aliases[alias]

    def _session_ended(self, session: RealtimeSession) -> None:
        for call in list(self._calls.values()):
            if call.session is session:
                call.end()  # its supervisor closes the peer connection


class DataChannel:
    """An `oai-events` data channel as a session :class:`~gateway.api.transports.channel.Channel`."""

    kind = "datachannel"

    def __init__(self, channel: RTCDataChannel) -> None:
        self.channel = channel
        # aiortc calls back on the loop: the messages, then None for the close.
        self._inbox: asyncio.Queue[str | bytes | None] = asyncio.Queue()
        channel.on("message", self._inbox.put_nowait)
        channel.on("close", lambda: self._inbox.put_nowait(None))

    async def receive(self) -> str | bytes:
        message = await self._inbox.get()
        if message is None:
            self._inbox.put_nowait(None)  # closed for good
            raise ChannelClosed(NO_CLOSE_FRAME)  # a data channel has no close code: resumable
        return message

    async def send(self, wire: str) -> None:
        while self.channel.readyState == "connecting":
            await asyncio.sleep(0.01)
        if self.channel.readyState != "open":
            raise ChannelClosed(NO_CLOSE_FRAME)
        self.channel.send(wire)

    async def close(self, code: int, reason: str) -> None:
        if self.channel.readyState in ("connecting", "open"):
            self.channel.close()


@dataclass
class Call:
    id: str
    pc: RTCPeerConnection
    session: RealtimeSession
    playout: PlayoutBuffer
    connected: asyncio.Event = field(default_factory=asyncio.Event)
    ended: asyncio.Event = field(default_factory=asyncio.Event)
    # The ephemeral key that opened the call is spent, but it may still hang the call up.
    secret_digest: str | None = None
    hub: SessionHub | None = None  # to park the session while its events channel is gone (resume)
    reader: InboundAudioReader | None = None
    tasks: list[asyncio.Task[Outcome]] = field(default_factory=list)  # its events channels' lifecycles

    def end(self) -> None:
        """Ends the call (its supervisor closes the session and the peer connection)."""
        self.ended.set()

    def follow_connection(self) -> None:
        """The peer connection's state: connected, or the call ends when it fails or closes."""
        @self.pc.on("connectionstatechange")
        def _on_state() -> None:
            if self.pc.connectionState == "connected":
                self.connected.set()
            elif self.pc.connectionState in ("failed", "closed"):
                self.ended.set()

    async def supervise(self, sessions: SessionRegistry, calls: CallIndex) -> None:
        """Owns the call: waits for its end (hang-up, failure, timeout), then closes everything."""
        try:
            waits = [asyncio.ensure_future(event.wait()) for event in (self.connected, self.ended)]
            try:
                await asyncio.wait(waits, timeout=CONNECT_TIMEOUT_S, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for wait in waits:
                    wait.cancel()
            if self.connected.is_set():
                await self.ended.wait()
        finally:
            calls.remove(self.id)
            if self.reader is not None:
                await self.reader.close()
            await sessions.end_session(self.session)
            for task in self.tasks:
                task.cancel()
            await asyncio.gather(*self.tasks, return_exceptions=True)
            await self.pc.close()

    def attach_channel(self, channel: RTCDataChannel) -> None:
        """An `oai-events` channel carries the session's events. One opened again on the same call
        resumes them: its protocol `last_sequence=<n>` replays the events after n first. Without its
        events channel the call goes on (the audio still flows) for the resume window."""
        if channel.label != EVENTS_CHANNEL or self.ended.is_set():
            return
        attachment = self.hub.reattach(self.session) if self.hub is not None else Attachment()
        try:
            reader = attach(self.session, _last_sequence(channel.protocol))
        except (ApiError, ValueError) as exc:
            reader = self.session.outbox.attach()  # the call goes on; the client hears of the gap
            self.session.send_error(exc if isinstance(exc, ApiError) else ApiError("resume_gap", str(exc), "last_sequence"))
        events = DataChannel(channel)

        async def end() -> None:
            self.end()

        self.tasks.append(asyncio.create_task(
            run_session(events, self.session, reader, attachment=attachment, hub=self.hub, end=end),
            name=f"datachannel {self.id}"))

    def attach_track(self, track: MediaStreamTrack) -> None:
        if track.kind != "audio" or self.reader is not None:
            return
        def on_chunk(chunk: Any) -> None:
            voice = self.session.voice  # created when the session starts, after the offer is read
            if voice is not None:
                try:
                    voice.append(chunk)
                except ApiError as error:
                    self.session.send_error(error)

        self.reader = InboundAudioReader(track, on_chunk, on_end=self.ended.set).start()


def _last_sequence(protocol: str) -> int | None:
    if not protocol:
        return None
    name, _, value = protocol.partition("=")
    if name != "last_sequence" or not value.isdigit():
        raise ValueError(f"The events channel's protocol must be 'last_sequence=<n>', not {protocol!r}.")
    return int(value)


def digest(token: str | None) -> str | None:
    return hashlib.sha256(token.encode()).hexdigest() if token else None


def validate_offer(sdp: str) -> None:
    if not sdp.startswith("v=0") or "\nm=" not in sdp.replace("\r\n", "\n"):
        raise ApiError("invalid_sdp", "The body is not an SDP offer.", "sdp")
    if not re.search(r"^m=audio ", sdp, flags=re.MULTILINE):
        raise ApiError("invalid_sdp", "The offer has no audio media section.", "sdp")


async def _read_offer(request: Request) -> tuple[str, dict[str, Any] | None]:
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if content_type not in ("application/sdp", "multipart/form-data"):
        raise ApiError("unsupported_media_type", "Send the offer as application/sdp (or multipart with 'sdp').", status=415)
    body = await read_body(request, MAX_SDP_BYTES)
    if content_type == "application/sdp":
        return body.decode("utf-8", errors="replace"), None
    return await _read_form(request, body)


async def _read_form(request: Request, body: bytes) -> tuple[str, dict[str, Any] | None]:
    """The `sdp` and `session` parts of a multipart offer: fields, as browsers send them, or files
    (`curl -F sdp=@offer.sdp`)."""

    async def chunks() -> AsyncGenerator[bytes, None]:
        yield body

    parser = MultiPartParser(request.headers, chunks(), max_files=2, max_fields=2, max_part_size=MAX_SDP_BYTES)
    try:
        form = await parser.parse()
    except MultiPartException as exc:
        raise ApiError("invalid_multipart", f"The multipart body cannot be read: {exc.message}") from None
    sdp = await _part(form.get("sdp"))
    if sdp is None:
        raise ApiError("missing_required_parameter", "Missing form field 'sdp'.", "sdp")
    session = await _part(form.get("session"))
    if session is None:
        return _text(sdp), None
    config = decode_json(session, param="session")
    if not isinstance(config, dict):
        raise ApiError("invalid_type", "The 'session' part must be a JSON object.", "session")
    return _text(sdp), config


async def _part(value: str | UploadFile | None) -> str | bytes | None:
    if isinstance(value, UploadFile):
        try:
            return await value.read()
        finally:
            await value.close()
    return value


def _text(value: str | bytes) -> str:
    return value.decode("utf-8", errors="replace") if isinstance(value, bytes) else value


async def _conversation(
    conversation: str | None = Query(None, max_length=64, description="A stored conversation the call continues."),
) -> str | None:
    return conversation


CallConversation = Annotated[str | None, Depends(_conversation)]
# The query is checked before the key (caller.py's authorized_after); a client secret is only looked up there, and
# spent when the call is set up (open_session).
CallCaller = Annotated[Caller, Depends(authorized_after(_conversation, allow_ephemeral=True))]

CALL_BODY = request_body({
    "application/sdp": {"schema": {"type": "string", "description": "The SDP offer."}},
    "multipart/form-data": {"schema": {
        "type": "object",
        "required": ["sdp"],
        "properties": {
            "sdp": {"type": "string", "description": "The SDP offer."},
            "session": {"type": "string", "description": "A Realtime session object (JSON) the call starts with."},
        },
    }},
})  # fmt: skip
CALL_ANSWER = {
    "description": "The SDP answer; Location: the call's URL.",
    "content": {"application/sdp": {"schema": {"type": "string"}}},
}


@router.post(
    "/v1/realtime/calls",
    status_code=201,
    response_class=Response,
    openapi_extra=CALL_BODY,
    responses={201: CALL_ANSWER, **error_responses(400, 401, 404, 413, 415, 429, 503)},
)
async def create_call(request: Request, conversation: CallConversation, caller: CallCaller) -> Response:
    svc = services(request)
    svc.runtime.require_ready()
    if not svc.runtime.voice_ready:
        raise ApiError("voice_unavailable", "WebRTC calls need the voice models, which are not loaded.", status=503)
    async with svc.sessions.seat(caller.key_id) as seat:  # 503 or 429 before any SDP work
        return await _set_up_call(svc, request, caller.principal, caller.headers, conversation, seat)


async def _set_up_call(svc: Services, request: Request, principal: Principal, headers: dict[str, str],
                       conversation: str | None, seat: Seat) -> Response:
    """The offer read, the session and its peer connection set up on `seat`, and the SDP answer."""
    sdp, session_config = await _read_offer(request)
    validate_offer(sdp)
    initial = principal.ephemeral_session or {}
    if session_config:
        initial = {**initial, **session_config}  # its type too: a "transcription" call only transcribes
    if "model" in initial:
        svc.runtime.require_model(str(initial["model"]), "session.model")

    playout = PlayoutBuffer(PLAYOUT_RATE, FRAME_SAMPLES)
    session = RealtimeSession(
        svc.runtime, svc.settings, transport="webrtc", speech_factory=PlayoutSpeech.create, initial_config=initial or None,
        request_id=getattr(request.state, "request_id", None), session_id=principal.ephemeral_session_id,
    )
    session.attach_playout(playout)
    if conversation is not None:
        try:
            await attach_stored_conversation(session, svc.stores.store, principal.key_id, conversation)
        except ApiError:
            await session.close()
            raise
    pc = RTCPeerConnection(RTCConfiguration(iceServers=ice_servers(svc.settings)))
    token = bearer_token(request.headers.get("authorization"))
    # The id names this replica, so that another replica can forward its hangup here.
    call = Call(id=new_id(f"rtc_{svc.settings.replica_id}"), pc=pc, session=session, playout=playout,
                secret_digest=digest(token))
    pc.on("datachannel", call.attach_channel)
    pc.on("track", call.attach_track)
    call.follow_connection()

    await answer_offer(svc, pc, session, OutboundAudioTrack(playout, on_event=session.on_playout_event), sdp,
                       principal, seat, sdp_param="sdp")
    call.hub = svc.sessions.hub
    session.start()
    calls: CallRegistry = request.app.state.calls
    calls.add(call)
    svc.sessions.in_background(call.supervise(svc.sessions, calls), f"call {call.id}")
    return Response(
        pc.localDescription.sdp,
        status_code=201,
        media_type="application/sdp",
        headers={**headers, "location": f"/v1/realtime/calls/{call.id}"},
    )


async def answer_offer(svc: Services, pc: RTCPeerConnection, session: RealtimeSession, track: OutboundAudioTrack,
                       sdp: str, principal: Principal, seat: Seat, *, sdp_param: str) -> None:
    """The offer taken, the session's track added and the answer made (pc.localDescription), then the session
    opened on `seat` (a client secret spent). On failure the peer connection and the session are closed; an
    offer aiortc cannot use is `invalid_sdp` (Realtime and GPT-Live calls alike)."""
    try:
        await pc.setRemoteDescription(RTCSessionDescription(sdp=sdp, type="offer"))
        shorten_audio_reorder_wait(pc, svc.settings.webrtc_audio_reorder_frames)
        pc.addTrack(track)
        await pc.setLocalDescription(await pc.createAnswer())
    except Exception as exc:  # aiortc raises ValueError and friends on offers it cannot use
        await pc.close()
        await session.close()
        raise ApiError("invalid_sdp", f"The SDP offer could not be used: {exc}", sdp_param) from None
    try:
        await svc.sessions.open_session(session, principal, seat)  # spends a client secret
    except ApiError:
        await pc.close()
        await session.close()
        raise


@router.post("/v1/realtime/calls/{call_id}/hangup", responses=error_responses(401, 404, 429))
async def hang_up(call_id: str, request: Request) -> Response:
    svc = services(request)
    call = request.app.state.calls.get(call_id)
    if call is None and (owner := await svc.stores.owner_url(replica_of(call_id))) is not None:
        return await forward_post(owner, request)  # the call lives on another replica: its owner answers
    token = bearer_token(request.headers.get("authorization"))
    # Not the caller dependency: the call's own client secret hangs it up without a key, and a call of another
    # replica is forwarded there before any check.
    if call is None or call.secret_digest is None or digest(token) != call.secret_digest:
        await svc.gate.authorize(token)
    if call is None:
        raise ApiError("call_not_found", f"No active call '{call_id}'.", "call_id", status=404)
    call.end()
    return JSONResponse({"id": call_id, "status": "ended"})
