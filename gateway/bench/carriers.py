"""`--mode twilio`, `--mode telnyx`, `--mode plivo`: a phone call through a carrier's media stream, with this module
standing in for the carrier.

CarrierLine is the carrier's side of one bidirectional stream, written from each carrier's published messages
(CallerWire: Twilio Media Streams, Telnyx Media Streaming, Plivo Audio Streams): the opening (`connected` and
`start`), then the caller's microphone as 20 ms G.711 `media` every 20 ms (silence between questions, as a phone
line sends), digits and the caller's hang-up; what the server sends plays as the carrier plays it: audio queues
behind what is playing, one 20 ms frame a tick, a mark (Plivo: a checkpoint) is echoed once the audio queued
before it has played, and a clear drops the queue (Twilio and Telnyx echo the marks still pending at once; Plivo
confirms with `clearedAudio` and never reaches them). The tests' callers are the same line.

CarrierStreamClient makes the bench's spoken turns over it (gateway/bench/phone.py): the events come from the
application's sideband on the call (`/v1/realtime?call_id=<the carrier's call id>`).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import secrets
import time
import uuid
from collections import deque
from collections.abc import Callable
from typing import Any, Literal
from urllib.parse import urlencode

import numpy as np
import websockets

from gateway.bench.clients import BenchError, Target
from gateway.bench.phone import FRAME, FRAME_S, RATE, PhoneCallClient, session_config, watch
from gateway.bench.stats import describe
from gateway.bench.voice import Microphone
from media.codecs import alaw_decode, alaw_encode, ulaw_decode, ulaw_encode

Kind = Literal["media", "mark", "clear"]  # what the server sends, whatever the carrier calls it


class CallerWire:
    """One carrier's messages, on the carrier's side of the stream. Twilio's are the base; the others rename."""

    name = "twilio"
    default_format: dict[str, Any] = {"encoding": "audio/x-mulaw", "sampleRate": RATE, "channels": 1}
    echoes_cleared_marks = True  # on a clear, the marks pending are echoed at once (Plivo: never)

    def url(self, base: str, parameters: dict[str, str]) -> str:
        """The stream URL for a server at `base` (http(s)://host:port). Twilio carries `parameters` in `start`."""
        return base.replace("http", "ws", 1) + f"/v1/telephony/{self.name}"

    def opening(self, line: CarrierLine, parameters: dict[str, str], media_format: dict[str, Any]) -> list[dict[str, Any]]:
        return [{"event": "connected", "protocol": "Call", "version": "1.0.0"},
                {"event": "start", "sequenceNumber": line.next_sequence(), "streamSid": line.stream_id, "start": {
                    "accountSid": "AC" + "0" * 32, "streamSid": line.stream_id, "callSid": line.call_id,
                    "tracks": ["inbound"], "customParameters": parameters, "mediaFormat": media_format}}]

    def media(self, line: CarrierLine, chunk: int, payload: str) -> dict[str, Any]:
        return {"event": "media", "sequenceNumber": line.next_sequence(), "streamSid": line.stream_id, "media": {
            "track": "inbound", "chunk": str(chunk), "timestamp": str((chunk - 1) * 20), "payload": payload}}

    def dtmf(self, line: CarrierLine, digit: str) -> dict[str, Any]:
        return {"event": "dtmf", "sequenceNumber": line.next_sequence(), "streamSid": line.stream_id,
                "dtmf": {"track": "inbound_track", "digit": digit}}

    def stop(self, line: CarrierLine) -> dict[str, Any] | None:
        """The caller hung up; None where the carrier just closes the socket."""
        return {"event": "stop", "sequenceNumber": line.next_sequence(), "streamSid": line.stream_id,
                "stop": {"accountSid": "AC" + "0" * 32, "callSid": line.call_id}}

    def echo(self, line: CarrierLine, name: str) -> dict[str, Any]:
        return {"event": "mark", "sequenceNumber": line.next_sequence(), "streamSid": line.stream_id,
                "mark": {"name": name}}

    def cleared(self, line: CarrierLine) -> dict[str, Any] | None:
        """What the carrier says after dropping its queue, if anything."""
        return None

    def received(self, message: dict[str, Any]) -> tuple[Kind, str] | None:
        """A server message as (kind, base64 payload or mark name)."""
        match message.get("event"):
            case "media":
                return "media", str(message["media"]["payload"])
            case "mark":
                return "mark", str(message["mark"]["name"])
            case "clear":
                return "clear", ""
        return None

    def sequence(self, number: int) -> str | int:
        return str(number)


class TelnyxCallerWire(CallerWire):
    name = "telnyx"
    default_format = {"encoding": "PCMU", "sample_rate": RATE, "channels": 1}

    def url(self, base: str, parameters: dict[str, str]) -> str:
        return super().url(base, parameters) + (f"?{urlencode(parameters)}" if parameters else "")

    def opening(self, line: CarrierLine, parameters: dict[str, str], media_format: dict[str, Any]) -> list[dict[str, Any]]:
        return [{"event": "connected", "version": "1.0.0"},
                {"event": "start", "sequence_number": line.next_sequence(), "stream_id": line.stream_id, "start": {
                    "user_id": str(uuid.uuid4()), "call_control_id": line.call_id, "client_state": "",
                    "from": "+15550100", "to": "+15550199", "media_format": media_format}}]

    def media(self, line: CarrierLine, chunk: int, payload: str) -> dict[str, Any]:
        return {"event": "media", "sequence_number": line.next_sequence(), "stream_id": line.stream_id, "media": {
            "track": "inbound", "chunk": str(chunk), "timestamp": str((chunk - 1) * 20), "payload": payload}}

    def dtmf(self, line: CarrierLine, digit: str) -> dict[str, Any]:
        return {"event": "dtmf", "sequence_number": line.next_sequence(), "stream_id": line.stream_id,
                "occurred_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "dtmf": {"digit": digit}}

    def stop(self, line: CarrierLine) -> dict[str, Any] | None:
        return {"event": "stop", "sequence_number": line.next_sequence(), "stream_id": line.stream_id,
                "stop": {"user_id": "", "call_control_id": line.call_id}}

    def echo(self, line: CarrierLine, name: str) -> dict[str, Any]:
        return {"event": "mark", "sequence_number": line.next_sequence(), "stream_id": line.stream_id,
                "mark": {"name": name}}


class PlivoCallerWire(CallerWire):
    name = "plivo"
    default_format = {"encoding": "audio/x-mulaw", "sampleRate": RATE}
    echoes_cleared_marks = False

    def url(self, base: str, parameters: dict[str, str]) -> str:
        return super().url(base, parameters) + (f"?{urlencode(parameters)}" if parameters else "")

    def opening(self, line: CarrierLine, parameters: dict[str, str], media_format: dict[str, Any]) -> list[dict[str, Any]]:
        return [{"event": "start", "sequenceNumber": line.next_sequence(), "start": {
            "callId": line.call_id, "streamId": line.stream_id, "accountId": "MA" + "0" * 18, "tracks": ["inbound"],
            "mediaFormat": media_format}, "extra_headers": ""}]

    def media(self, line: CarrierLine, chunk: int, payload: str) -> dict[str, Any]:
        return {"event": "media", "sequenceNumber": line.next_sequence(), "streamId": line.stream_id, "media": {
            "track": "inbound", "timestamp": str(int(time.time() * 1000)), "chunk": chunk, "payload": payload}}

    def dtmf(self, line: CarrierLine, digit: str) -> dict[str, Any]:
        return {"event": "dtmf", "sequenceNumber": line.next_sequence(), "streamId": line.stream_id,
                "dtmf": {"track": "inbound", "digit": digit, "timestamp": str(int(time.time() * 1000))}}

    def stop(self, line: CarrierLine) -> dict[str, Any] | None:
        return None

    def echo(self, line: CarrierLine, name: str) -> dict[str, Any]:
        return {"event": "playedStream", "sequenceNumber": line.next_sequence(), "streamId": line.stream_id,
                "name": name}

    def cleared(self, line: CarrierLine) -> dict[str, Any] | None:
        return {"event": "clearedAudio", "sequenceNumber": line.next_sequence(), "streamId": line.stream_id}

    def received(self, message: dict[str, Any]) -> tuple[Kind, str] | None:
        match message.get("event"):
            case "playAudio":
                return "media", str(message["media"]["payload"])
            case "checkpoint":
                return "mark", str(message["name"])
            case "clearAudio":
                return "clear", ""
        return None

    def sequence(self, number: int) -> str | int:
        return number


CALLER_WIRES: dict[str, CallerWire] = {wire.name: wire for wire in (CallerWire(), TelnyxCallerWire(), PlivoCallerWire())}
CARRIERS = tuple(CALLER_WIRES)  # the bench's modes of the same names
_CODECS = {"PCMA": (alaw_decode, alaw_encode)}  # by the start's encoding; mu-law otherwise


class CarrierLine:
    """The carrier's side of one stream (see the module's text). `on_played(at, pcm)`: each 20 ms frame as it
    plays."""

    def __init__(self, wire: CallerWire, connection: websockets.ClientConnection, mic: Microphone,
                 on_played: Callable[[float, np.ndarray], None] | None, encoding: str) -> None:
        self.wire = wire
        self.connection = connection
        self.mic = mic
        self.stream_id = "MZ" + secrets.token_hex(16) if wire.name == "twilio" else str(uuid.uuid4())
        self.call_id = {"twilio": "CA" + secrets.token_hex(16), "telnyx": "v3:" + secrets.token_urlsafe(24)}.get(
            wire.name, str(uuid.uuid4()))
        self.on_played = on_played
        self.heard: list[tuple[float, np.ndarray]] = []  # (perf_counter, pcm) of every frame played
        self.messages: list[dict[str, Any]] = []  # from the server, each with "_at" (perf_counter) and "_kind"
        self.media_gaps_ms: list[float] = []  # between the server's media messages while a reply streams
        self.closed = asyncio.Event()
        self.close_code: int | None = None
        self.close_reason = ""
        self._decode, self._encode = _CODECS.get(encoding, (ulaw_decode, ulaw_encode))
        self._queued: deque[np.ndarray | str] = deque()  # frames to play, and marks between them
        self._sequence = 0
        self._last_media: float | None = None
        self._tasks: list[asyncio.Task[None]] = []

    @classmethod
    async def dial(cls, carrier: str, url: str, parameters: dict[str, str], *, mic: Microphone | None = None,
                   on_played: Callable[[float, np.ndarray], None] | None = None,
                   media_format: dict[str, Any] | None = None) -> CarrierLine:
        """`url`: the gateway's http(s)://host:port. `parameters`: the application's settings for the stream."""
        wire = CALLER_WIRES[carrier]
        media_format = media_format or wire.default_format
        connection = await websockets.connect(wire.url(url, parameters), max_size=None)
        line = cls(wire, connection, mic or Microphone(RATE, tail_s=0, always_on=True), on_played,
                   str(media_format.get("encoding", "")))
        for message in wire.opening(line, parameters, media_format):
            await line.send(message)
        line._tasks = [asyncio.create_task(line._downlink()), asyncio.create_task(line._uplink()),
                       asyncio.create_task(line._play())]
        return line

    def next_sequence(self) -> str | int:
        self._sequence += 1
        return self.wire.sequence(self._sequence)

    async def send(self, message: dict[str, Any]) -> None:
        await self.connection.send(json.dumps(message))

    def say(self, pcm: np.ndarray) -> None:
        """Speak 8 kHz int16 audio into the call after what is still being said."""
        self.mic.say(pcm)

    async def press(self, digit: str) -> None:
        await self.send(self.wire.dtmf(self, digit))

    async def hang_up(self) -> None:
        """The caller hung up: the carrier's `stop`, or its socket closed."""
        with contextlib.suppress(websockets.ConnectionClosed):
            stop = self.wire.stop(self)
            if stop is None:
                await self.connection.close()
            else:
                await self.send(stop)

    def of_kind(self, kind: Kind) -> list[dict[str, Any]]:
        return [message for message in self.messages if message["_kind"] == kind]

    async def wait_closed(self, timeout: float) -> None:
        await asyncio.wait_for(self.closed.wait(), timeout)

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.connection.close()

    async def _downlink(self) -> None:
        try:
            async for raw in self.connection:
                at = time.perf_counter()
                message = json.loads(raw)
                received = self.wire.received(message)
                message["_at"], message["_kind"] = at, received[0] if received is not None else None
                self.messages.append(message)
                match received:
                    case ("media", payload):
                        if self._last_media is not None and at - self._last_media < 1.0:  # within one reply
                            self.media_gaps_ms.append((at - self._last_media) * 1000)
                        self._last_media = at
                        self._queued.append(self._decode(base64.b64decode(payload)))
                    case ("mark", name):
                        self._queued.append(name)
                    case ("clear", _):
                        pending = [entry for entry in self._queued if isinstance(entry, str)]
                        self._queued.clear()
                        if self.wire.echoes_cleared_marks:
                            for name in pending:
                                await self._echo(name)
                        if (cleared := self.wire.cleared(self)) is not None:
                            await self.send(cleared)
        except websockets.ConnectionClosed:
            pass
        finally:
            self.close_code = self.connection.close_code
            self.close_reason = self.connection.close_reason or ""
            self.closed.set()

    async def _uplink(self) -> None:
        chunk = 0
        with contextlib.suppress(websockets.ConnectionClosed):
            while True:
                pcm = await self.mic.next_chunk()  # always on: silence between what is said
                up = pcm if pcm is not None else np.zeros(FRAME, np.int16)
                chunk += 1
                await self.send(self.wire.media(self, chunk, base64.b64encode(self._encode(up)).decode("ascii")))

    async def _play(self) -> None:
        """One queued frame every 20 ms; a mark is echoed once the frames before it have played."""
        start, ticks = time.perf_counter(), 0
        with contextlib.suppress(websockets.ConnectionClosed):
            while True:
                await self._echo_reached()
                if self._queued:
                    played = self._queued.popleft()
                    assert not isinstance(played, str)
                    at = time.perf_counter()
                    self.heard.append((at, played))
                    if self.on_played is not None:
                        self.on_played(at, played)
                    await self._echo_reached()
                ticks += 1
                await asyncio.sleep(max(0.0, start + ticks * FRAME_S - time.perf_counter()))

    async def _echo_reached(self) -> None:
        while self._queued and isinstance(self._queued[0], str):
            await self._echo(str(self._queued.popleft()))

    async def _echo(self, name: str) -> None:
        await self.send(self.wire.echo(self, name))


class CarrierStreamClient(PhoneCallClient):
    """Spoken turns over a carrier's stream, the call's events on its sideband by the carrier's call id."""

    def __init__(self, target: Target, carrier: str, barge_in_after_s: float | None) -> None:
        super().__init__(target, barge_in_after_s)
        self.carrier = carrier
        self.line: CarrierLine | None = None

    @classmethod
    async def open(cls, target: Target, carrier: str, system_prompt: str | None, barge_in_after_s: float | None
                   ) -> CarrierStreamClient:
        return await cls(target, carrier, barge_in_after_s)._dialled(system_prompt)

    async def _call(self, system_prompt: str | None) -> None:
        parameters = {"session": json.dumps(session_config(self.target, system_prompt))}
        if self.target.api_key:
            parameters["api_key"] = self.target.api_key
        try:
            self.line = await CarrierLine.dial(self.carrier, self.target.url, parameters, mic=self.mic,
                                               on_played=self.played)
            self.watching(await watch(self.target.url, self.line.call_id, self.target.headers))
        except (OSError, websockets.InvalidHandshake) as exc:
            raise BenchError(f"cannot reach {self.target.url}'s {self.carrier} endpoint: {exc}") from None
        except websockets.ConnectionClosed:
            reason = self.line.close_reason if self.line is not None else ""
            raise BenchError(f"the server closed the stream: {reason}", "stream_refused") from None

    async def link_stats(self) -> dict[str, Any]:
        """The downlink as the line saw it: media messages' interarrival (20 ms when paced) and what played."""
        line = self.line
        gaps = line.media_gaps_ms if line is not None else []
        return {
            "media_messages": len(line.of_kind("media")) if line is not None else 0,
            "media_interarrival_ms": describe(gaps),
            # Over TCP nothing is lost; late is what a listener hears: gaps over two frames within a reply.
            "media_gaps_over_40ms": sum(gap > 40 for gap in gaps),
            "jitter_ms": round(float(np.std(gaps)), 2) if gaps else None,
            **self.audio_stats(),
        }

    async def close(self) -> None:
        await super().close()
        if self.line is not None:
            await self.line.hang_up()
            await self.line.close()
