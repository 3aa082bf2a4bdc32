"""`--mode twilio`: a phone call through Twilio Media Streams, with this module standing in for Twilio.

TwilioLine is Twilio's side of a bidirectional stream, written from Twilio's published messages
(https://www.twilio.com/docs/voice/media-streams/websocket-messages): `connected` and `start`, then the caller's
microphone as 20 ms mu-law `media` every 20 ms (silence between questions, as a phone line sends), `dtmf` and
`stop`; what the server sends plays as Twilio plays it: `media` queues behind what is playing, one 20 ms frame a
tick, a `mark` is echoed once the audio queued before it has played, and `clear` drops the queue and echoes the
marks still pending at once. The tests' caller is the same line.

TwilioStreamClient makes the bench's spoken turns over it (gateway/bench/phone.py): the events come from the
application's sideband on the call (`/v1/realtime?call_id=<callSid>`).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import secrets
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import numpy as np
import websockets

from gateway.bench.clients import BenchError, Target
from gateway.bench.phone import FRAME, FRAME_S, RATE, PhoneCallClient, session_config, watch
from gateway.bench.stats import describe
from gateway.bench.voice import Microphone
from media.codecs import ulaw_decode, ulaw_encode


class TwilioLine:
    """Twilio's side of one stream (see the module's text). `on_played(at, pcm)`: each 20 ms frame as it plays."""

    def __init__(self, connection: websockets.ClientConnection, mic: Microphone,
                 on_played: Callable[[float, np.ndarray], None] | None = None) -> None:
        self.connection = connection
        self.mic = mic
        self.stream_sid = "MZ" + secrets.token_hex(16)
        self.call_sid = "CA" + secrets.token_hex(16)
        self.on_played = on_played
        self.heard: list[tuple[float, np.ndarray]] = []  # (perf_counter, pcm) of every frame played
        self.messages: list[dict[str, Any]] = []  # from the server, each with "_at" (perf_counter)
        self.media_gaps_ms: list[float] = []  # between the server's media messages while a reply streams
        self.closed = asyncio.Event()
        self.close_code: int | None = None
        self.close_reason = ""
        self._queued: deque[np.ndarray | str] = deque()  # frames to play, and marks between them
        self._sequence = 1
        self._last_media: float | None = None
        self._tasks: list[asyncio.Task[None]] = []

    @classmethod
    async def dial(cls, url: str, parameters: dict[str, str], *, mic: Microphone | None = None,
                   on_played: Callable[[float, np.ndarray], None] | None = None,
                   media_format: dict[str, Any] | None = None) -> TwilioLine:
        """`url`: the gateway's ws(s)://.../v1/telephony/twilio. `parameters`: the stream's <Parameter>s."""
        connection = await websockets.connect(url, max_size=None)
        line = cls(connection, mic or Microphone(RATE, tail_s=0, always_on=True), on_played)
        await line.send({"event": "connected", "protocol": "Call", "version": "1.0.0"})
        await line.send({"event": "start", "streamSid": line.stream_sid, "start": {
            "accountSid": "AC" + "0" * 32, "streamSid": line.stream_sid, "callSid": line.call_sid,
            "tracks": ["inbound"], "customParameters": parameters,
            "mediaFormat": media_format or {"encoding": "audio/x-mulaw", "sampleRate": RATE, "channels": 1}}})
        line._tasks = [asyncio.create_task(line._downlink()), asyncio.create_task(line._uplink()),
                       asyncio.create_task(line._play())]
        return line

    async def send(self, message: dict[str, Any]) -> None:
        if message["event"] != "connected":
            self._sequence += 1
            message = {**message, "sequenceNumber": str(self._sequence)}
        await self.connection.send(json.dumps(message))

    def say(self, pcm: np.ndarray) -> None:
        """Speak 8 kHz int16 audio into the call after what is still being said."""
        self.mic.say(pcm)

    async def press(self, digit: str) -> None:
        await self.send({"event": "dtmf", "streamSid": self.stream_sid, "dtmf": {"track": "inbound_track", "digit": digit}})

    async def hang_up(self) -> None:
        """Twilio's `stop`: the caller hung up."""
        with contextlib.suppress(websockets.ConnectionClosed):
            await self.send({"event": "stop", "streamSid": self.stream_sid,
                             "stop": {"accountSid": "AC" + "0" * 32, "callSid": self.call_sid}})

    def of_event(self, event: str) -> list[dict[str, Any]]:
        return [message for message in self.messages if message["event"] == event]

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
                message["_at"] = at
                self.messages.append(message)
                match message.get("event"):
                    case "media":
                        if self._last_media is not None and at - self._last_media < 1.0:  # within one reply
                            self.media_gaps_ms.append((at - self._last_media) * 1000)
                        self._last_media = at
                        self._queued.append(ulaw_decode(base64.b64decode(message["media"]["payload"])))
                    case "mark":
                        self._queued.append(str(message["mark"]["name"]))
                    case "clear":
                        pending = [entry for entry in self._queued if isinstance(entry, str)]
                        self._queued.clear()
                        for name in pending:
                            await self._echo(name)
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
                await self.send({"event": "media", "streamSid": self.stream_sid, "media": {
                    "track": "inbound", "chunk": str(chunk), "timestamp": str((chunk - 1) * 20),
                    "payload": base64.b64encode(ulaw_encode(up)).decode("ascii")}})

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
        await self.send({"event": "mark", "streamSid": self.stream_sid, "mark": {"name": name}})


def stream_url(url: str) -> str:
    """The gateway's Twilio endpoint for a server at `url` (http(s)://host:port)."""
    return url.replace("http", "ws", 1) + "/v1/telephony/twilio"


class TwilioStreamClient(PhoneCallClient):
    """Spoken turns over a Twilio stream, the call's events on its sideband by Twilio's callSid."""

    def __init__(self, target: Target, barge_in_after_s: float | None) -> None:
        super().__init__(target, barge_in_after_s)
        self.line: TwilioLine | None = None

    @classmethod
    async def open(cls, target: Target, system_prompt: str | None, barge_in_after_s: float | None) -> TwilioStreamClient:
        return await cls(target, barge_in_after_s)._dialled(system_prompt)

    async def _call(self, system_prompt: str | None) -> None:
        parameters = {"session": json.dumps(session_config(self.target, system_prompt))}
        if self.target.api_key:
            parameters["api_key"] = self.target.api_key
        try:
            self.line = await TwilioLine.dial(stream_url(self.target.url), parameters, mic=self.mic,
                                              on_played=self.played)
            self.watching(await watch(self.target.url, self.line.call_sid, self.target.headers))
        except (OSError, websockets.InvalidHandshake) as exc:
            raise BenchError(f"cannot reach {self.target.url}'s Twilio endpoint: {exc}") from None
        except websockets.ConnectionClosed:
            reason = self.line.close_reason if self.line is not None else ""
            raise BenchError(f"the server closed the stream: {reason}", "stream_refused") from None

    async def link_stats(self) -> dict[str, Any]:
        """The downlink as the line saw it: media messages' interarrival (20 ms when paced) and what played."""
        line = self.line
        gaps = line.media_gaps_ms if line is not None else []
        return {
            "media_messages": len(line.of_event("media")) if line is not None else 0,
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
