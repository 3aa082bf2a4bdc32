"""Phone calls through a carrier's media stream, each a Realtime session like a WebRTC call:
GET /v1/telephony/twilio (Twilio Media Streams), /v1/telephony/telnyx (Telnyx Media Streaming) and
/v1/telephony/plivo (Plivo Audio Streams). Each carrier's messages are its module's in gateway/protocol/.

The application points the call's bidirectional stream here, with the settings this endpoint reads (PARAMETERS):
Twilio as the stream's `<Parameter>`s, Telnyx and Plivo in the stream URL's query string:

    <Connect><Stream url="wss://gateway.example/v1/telephony/twilio">
      <Parameter name="api_key" value="..."/>            <!-- an API key or a client secret -->
      <Parameter name="session" value='{"instructions": "..."}'/>   <!-- optional: a Realtime session object -->
    </Stream></Connect>

    wss://gateway.example/v1/telephony/telnyx?api_key=ek_...&session=%7B%22instructions%22%3A...%7D

The caller's G.711 goes to the session's VAD and turns at 16 kHz; the replies' audio comes back paced at 20 ms a
frame from a CarrierPlayout, which knows what the caller heard from the carrier's echoes of our marks (Plivo's
checkpoints), so an interruption clears the carrier's buffer and keeps of the reply only what was heard. Keypad
digits become `input_audio_buffer.dtmf_event_received`. The application watches and steers the call over
`/v1/realtime?call_id=<id or the carrier's call id>` and hangs it up with `/v1/realtime/calls/<id>/hangup`.

A carrier has no error channel: a refused stream is closed with a code (1008 refused, 1013 try again later, 1007 a
malformed message) and a reason naming what was wrong, and logged.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from fastapi import APIRouter, WebSocket
from starlette.websockets import WebSocketDisconnect, WebSocketState

from gateway.api.services import Services, services
from gateway.api.transports.webrtc import CallRegistry, digest
from gateway.platform.auth import bearer_token
from gateway.platform.event_log import log_event
from gateway.protocol import carrier_media as carrier
from gateway.protocol.carrier_media import CarrierWire
from gateway.protocol.errors import ApiError
from gateway.protocol.json_input import decode_json
from gateway.protocol.plivo_media import PlivoWire
from gateway.protocol.telnyx_media import TelnyxWire
from gateway.protocol.twilio_media import TwilioWire
from gateway.realtime.conversation import new_id
from gateway.realtime.recorder import attach_stored_conversation
from gateway.realtime.session import RealtimeSession, TransportKind
from gateway.realtime.speech_out import PlayoutSpeech
from media.carrier_playout import CarrierPlayout
from media.codecs import alaw_decode, alaw_encode, ulaw_decode, ulaw_encode
from media.frames import AudioChunk
from media.resample import Resampler

log = logging.getLogger(__name__)
router = APIRouter()

RATE = carrier.SAMPLE_RATE
FRAME_SAMPLES = RATE // 50  # 20 ms
LISTEN_RATE = 16000  # what the session's VAD and Whisper take
START_TIMEOUT_S = 10.0  # carriers send `start` as soon as the socket opens
PARAMETERS = ("api_key", "session", "conversation")  # the settings this endpoint reads
CODECS: dict[carrier.Encoding, tuple[Callable[[bytes], np.ndarray], Callable[[np.ndarray], bytes]]] = {
    "mulaw": (ulaw_decode, ulaw_encode), "alaw": (alaw_decode, alaw_encode)}
WIRES: dict[TransportKind, CarrierWire] = {"twilio": TwilioWire(), "telnyx": TelnyxWire(), "plivo": PlivoWire()}
_MAX_LAG_S = 0.2  # the pacer that fell this far behind (a stalled loop) restarts its clock
CLOSE_REFUSED, CLOSE_MALFORMED, CLOSE_TRY_AGAIN = 1008, 1007, 1013


class StreamRefused(Exception):
    """The stream cannot become a session: closed with `code` and `reason` (no user text in it)."""

    def __init__(self, code: int, reason: str) -> None:
        super().__init__(reason)
        self.code = code
        self.reason = reason


@dataclass(eq=False)
class CarrierCall:
    """One call's stream: owns the pacer and the writer, which the endpoint cancels and awaits."""

    id: str
    session: RealtimeSession
    websocket: WebSocket
    wire: CarrierWire
    start: carrier.StreamStart
    secret_digest: str | None = None  # the client secret that opened it may hang it up
    ended: asyncio.Event = field(default_factory=asyncio.Event)
    _outgoing: asyncio.Queue[str] = field(default_factory=asyncio.Queue)
    _inbound: Resampler = field(default_factory=lambda: Resampler(RATE, LISTEN_RATE, quality="LQ"))
    playout: CarrierPlayout = field(init=False)

    def __post_init__(self) -> None:
        self.playout = CarrierPlayout(RATE, FRAME_SAMPLES, on_clear=self._cleared)
        assert self.start.codec is not None  # _read_start refuses the rest
        self._decode, self._encode = CODECS[self.start.codec]

    @property
    def stream_id(self) -> str:
        return self.start.stream_id

    def end(self) -> None:
        self.ended.set()

    def _cleared(self) -> None:
        """The session cut the reply (barge-in): the carrier drops the audio it holds too."""
        self._outgoing.put_nowait(self.wire.clear(self.stream_id))

    # -- from the carrier -------------------------------------------------------------------------

    def handle(self, message: carrier.Inbound) -> None:
        match message:
            case carrier.StreamAudio(g711=g711):
                self._hear(g711)
            case carrier.StreamPlayed(name=name):
                sent = self.playout.echoed(name)
                if sent is not None and sent.last:
                    self.session.on_playout_event("stopped", sent.item_id)
            case carrier.StreamDigit(digit=digit):
                try:
                    self.session.dtmf_received(digit, received_at=int(time.time()))
                except ApiError as error:
                    self.session.send_error(error)
            case carrier.StreamStop():
                self.end()
            case carrier.StreamNotice(error=str(code)):
                log_event("telephony.stream.carrier_error", carrier=self.wire.name, call_id=self.id, code=code)
            case carrier.StreamNotice() | carrier.StreamStart():
                pass  # a second start of the same stream changes nothing

    def _hear(self, g711: bytes) -> None:
        voice = self.session.voice
        if voice is None or not g711:
            return
        pcm = self._inbound.process(self._decode(g711))
        if pcm.size:
            try:
                voice.append(AudioChunk(pcm, LISTEN_RATE))
            except ApiError as error:
                self.session.send_error(error)

    # -- to the carrier ---------------------------------------------------------------------------

    async def pace(self) -> None:
        """20 ms frames of the replies' audio as they are due, each followed by the mark it makes due."""
        loop = asyncio.get_running_loop()
        start, frames, last_item = loop.time(), 0, None
        while True:
            frame = self.playout.read_frame()
            if frame.item_id is not None:
                last_item = frame.item_id
            if frame.started:
                self.session.on_playout_event("started", frame.item_id)
            if frame.audio_samples:
                self._outgoing.put_nowait(self.wire.media(self.stream_id, self._encode(frame.pcm)))
            mark = self.playout.mark_due(frame, last_item)
            if mark is not None:
                self._outgoing.put_nowait(self.wire.mark(self.stream_id, mark.name))
            frames += 1
            wait = start + frames * FRAME_SAMPLES / RATE - loop.time()
            if wait < -_MAX_LAG_S:
                start, frames = loop.time(), 0
            await asyncio.sleep(max(0.0, wait))

    async def write(self) -> None:
        """The only sender on the socket: media, marks and clears in the order they were made."""
        while True:
            await self.websocket.send_text(await self._outgoing.get())

    def drop_events(self) -> asyncio.Task[None]:
        """The session's events have no reader of their own on a phone call (a sideband taps a copy): taken and
        dropped, so that they do not pile up for the whole call."""
        reader = self.session.outbox.attach()

        async def drain() -> None:
            while await reader.next() is not None:
                pass

        return asyncio.create_task(drain(), name=f"events {self.id}")


@router.websocket("/v1/telephony/twilio")
async def twilio_media_stream(websocket: WebSocket) -> None:
    await _carrier_stream(websocket, "twilio")


@router.websocket("/v1/telephony/telnyx")
async def telnyx_media_stream(websocket: WebSocket) -> None:
    await _carrier_stream(websocket, "telnyx")


@router.websocket("/v1/telephony/plivo")
async def plivo_audio_stream(websocket: WebSocket) -> None:
    await _carrier_stream(websocket, "plivo")


async def _carrier_stream(websocket: WebSocket, transport: TransportKind) -> None:
    svc = services(websocket)
    wire = WIRES[transport]
    await websocket.accept()
    call: CarrierCall | None = None
    try:
        start = await _read_start(websocket, wire)
        call = await _open_call(svc, websocket, wire, transport, start)
    except StreamRefused as refused:
        log_event("telephony.stream.refused", carrier=wire.name, code=refused.code, reason=refused.reason)
        await _close(websocket, refused.code, refused.reason)
        return
    calls: CallRegistry = websocket.app.state.calls
    calls.add(call, alias=call.start.call_id or None)
    log_event("telephony.stream.started", carrier=wire.name, call_id=call.id, session_id=call.session.id)
    tasks: list[asyncio.Task[Any]] = [
        asyncio.create_task(call.pace(), name=f"pace {call.id}"),
        asyncio.create_task(call.write(), name=f"write {call.id}"),
        call.drop_events(),
        asyncio.create_task(_receive(websocket, call), name=f"receive {call.id}"),
        asyncio.create_task(call.ended.wait(), name=f"ended {call.id}"),
    ]
    code, reason = 1000, ""
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        for task in done:
            failure = None if task.cancelled() else task.exception()
            if isinstance(failure, StreamRefused):
                code, reason = failure.code, failure.reason
                log_event("telephony.stream.refused", carrier=wire.name, call_id=call.id, code=code, reason=reason)
            elif failure is not None and not isinstance(failure, WebSocketDisconnect | OSError):
                log.error("%s stream %s failed", wire.name, call.id, exc_info=failure)
                code, reason = 1011, "server error"
    finally:
        calls.remove(call.id)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await svc.sessions.end_session(call.session)
        await _close(websocket, code, reason)
        log_event("telephony.stream.ended", carrier=wire.name, call_id=call.id, session_id=call.session.id)


async def _receive(websocket: WebSocket, call: CarrierCall) -> None:
    """The carrier's messages until it stops the stream or the socket closes."""
    while not call.ended.is_set():
        try:
            raw = await websocket.receive_text()
        except (WebSocketDisconnect, RuntimeError, KeyError):
            return  # gone (a binary frame is no carrier's either)
        try:
            message = call.wire.parse(raw, websocket.query_params)
            if message is not None:
                call.handle(message)
        except carrier.CarrierMessageError as exc:
            raise StreamRefused(CLOSE_MALFORMED, str(exc)) from None


async def _read_start(websocket: WebSocket, wire: CarrierWire) -> carrier.StreamStart:
    """`start` (after `connected`, where the carrier sends one), within START_TIMEOUT_S."""
    async def first_start() -> carrier.StreamStart:
        while True:
            try:
                raw = await websocket.receive_text()
            except (WebSocketDisconnect, RuntimeError, KeyError):
                raise StreamRefused(CLOSE_REFUSED, "The stream closed before its 'start' message.") from None
            try:
                message = wire.parse(raw, websocket.query_params)
            except carrier.CarrierMessageError as exc:
                raise StreamRefused(CLOSE_MALFORMED, str(exc)) from None
            if isinstance(message, carrier.StreamStart):
                return message
            if message is not None and not isinstance(message, carrier.StreamNotice):
                raise StreamRefused(CLOSE_REFUSED, "A stream message came before the stream's 'start' message.")

    try:
        start = await asyncio.wait_for(first_start(), START_TIMEOUT_S)
    except TimeoutError:
        raise StreamRefused(CLOSE_REFUSED, f"No 'start' message within {START_TIMEOUT_S:.0f} s.") from None
    if start.codec is None or start.sample_rate != RATE or start.channels != 1:
        raise StreamRefused(CLOSE_REFUSED, f"The stream's media must be {wire.encodings}, not {start.encoding[:40]} "
                            f"at {start.sample_rate} Hz.")
    unknown = sorted(set(start.parameters) - set(PARAMETERS))
    if unknown:
        raise StreamRefused(CLOSE_REFUSED, f"Unknown stream parameter '{unknown[0][:40]}': this endpoint reads "
                            f"{', '.join(PARAMETERS)}.")
    return start


async def _open_call(svc: Services, websocket: WebSocket, wire: CarrierWire, transport: TransportKind,
                     start: carrier.StreamStart) -> CarrierCall:
    """The stream's session, opened on a seat of its key: refused as the WebSocket transport refuses one."""
    parameters: Mapping[str, str] = start.parameters
    token = parameters.get("api_key") or bearer_token(websocket.headers.get("authorization"))
    try:
        principal = (await svc.gate.authorize(token, allow_ephemeral=True)).principal
        svc.runtime.require_ready()
        if not svc.runtime.voice_ready:
            raise ApiError("voice_unavailable", "Phone calls need the voice models, which are not loaded.", status=503)
        initial = dict(principal.ephemeral_session or {})
        if (session_json := parameters.get("session")) is not None:
            update = decode_json(session_json, param="session")
            if not isinstance(update, dict):
                raise ApiError("invalid_type", "The 'session' parameter must be a JSON object.", "session")
            initial.update(update)
        if "model" in initial:
            svc.runtime.require_model(str(initial["model"]), "session.model")
        async with svc.sessions.seat(principal.key_id) as seat:
            session = RealtimeSession(svc.runtime, svc.settings, transport=transport,
                                      speech_factory=PlayoutSpeech.create, initial_config=initial or None,
                                      session_id=principal.ephemeral_session_id)
            call = CarrierCall(id=new_id(f"rtc_{svc.settings.replica_id}"), session=session, websocket=websocket,
                               wire=wire, start=start,
                               secret_digest=digest(token) if principal.secret is not None else None)
            session.attach_playout(call.playout)
            try:
                if (stored := parameters.get("conversation")) is not None:
                    await attach_stored_conversation(session, svc.stores.store, principal.key_id, stored)
                await svc.sessions.open_session(session, principal, seat)  # spends a client secret
            except ApiError:
                await session.close()
                raise
            session.start()
            return call
    except ApiError as error:
        code = CLOSE_TRY_AGAIN if error.status in (429, 503) else CLOSE_REFUSED
        raise StreamRefused(code, f"{error.code}: {error.message}") from None


async def _close(websocket: WebSocket, code: int, reason: str) -> None:
    if websocket.application_state == WebSocketState.CONNECTED:
        with contextlib.suppress(Exception):  # the carrier may be gone by now
            await websocket.close(code, reason[:120])  # a close reason is at most 123 bytes
