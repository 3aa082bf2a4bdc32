"""Twilio's side of a bidirectional Media Stream, written from Twilio's published messages
(https://www.twilio.com/docs/voice/media-streams/websocket-messages), for tests and benchmarks.

It sends `connected`, `start`, the caller's audio as 20 ms mu-law `media` every 20 ms (silence between what it
is told to say, as a phone line does), `dtmf` and `stop`; it plays what the server sends as Twilio does: `media`
is queued behind what is already playing, a `mark` is echoed once the audio queued before it has played, and
`clear` drops the queued audio and echoes the marks still pending at once.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import websockets

from media.codecs import ulaw_decode, ulaw_encode

RATE = 8000
FRAME = RATE // 50  # 20 ms


@dataclass
class TwilioCaller:
    connection: websockets.ClientConnection
    stream_sid: str
    call_sid: str
    heard: list[tuple[float, np.ndarray]] = field(default_factory=list)  # (monotonic, 20 ms of pcm) as played
    messages: list[dict[str, Any]] = field(default_factory=list)  # every message from the server, with "_at"
    closed: asyncio.Event = field(default_factory=asyncio.Event)
    close_code: int | None = None
    close_reason: str = ""
    _speech: deque[np.ndarray] = field(default_factory=deque)  # frames still to say
    _queued: deque[np.ndarray | str] = field(default_factory=deque)  # frames to play, and marks between them
    _sequence: int = 1
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)

    @classmethod
    async def dial(cls, url: str, parameters: dict[str, str], call_sid: str = "CA" + "1" * 32,
                   stream_sid: str = "MZ" + "2" * 32, media_format: dict[str, Any] | None = None) -> TwilioCaller:
        connection = await websockets.connect(url, max_size=None)
        caller = cls(connection, stream_sid, call_sid)
        await caller.send({"event": "connected", "protocol": "Call", "version": "1.0.0"})
        await caller.send({"event": "start", "streamSid": stream_sid, "start": {
            "accountSid": "AC" + "0" * 32, "streamSid": stream_sid, "callSid": call_sid, "tracks": ["inbound"],
            "customParameters": parameters,
            "mediaFormat": media_format or {"encoding": "audio/x-mulaw", "sampleRate": RATE, "channels": 1}}})
        caller._tasks = [asyncio.create_task(caller._receive()), asyncio.create_task(caller._line())]
        return caller

    async def send(self, message: dict[str, Any]) -> None:
        if message["event"] != "connected":
            self._sequence += 1
            message = {**message, "sequenceNumber": str(self._sequence)}
        await self.connection.send(json.dumps(message))

    def say(self, pcm: np.ndarray) -> None:
        """Speak 8 kHz int16 audio into the call, from the next frame."""
        pcm = np.concatenate([pcm, np.zeros((-len(pcm)) % FRAME, np.int16)])
        self._speech.extend(pcm.reshape(-1, FRAME))

    @property
    def saying(self) -> bool:
        return bool(self._speech)

    async def press(self, digit: str) -> None:
        await self.send({"event": "dtmf", "streamSid": self.stream_sid, "dtmf": {"track": "inbound_track", "digit": digit}})

    async def hang_up(self) -> None:
        await self.send({"event": "stop", "streamSid": self.stream_sid,
                         "stop": {"accountSid": "AC" + "0" * 32, "callSid": self.call_sid}})

    def of_event(self, event: str) -> list[dict[str, Any]]:
        return [message for message in self.messages if message["event"] == event]

    def audio_between(self, start: float, end: float) -> np.ndarray:
        frames = [pcm for at, pcm in self.heard if start <= at <= end]
        return np.concatenate(frames) if frames else np.zeros(0, np.int16)

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.connection.close()

    async def wait_closed(self, timeout: float) -> None:
        await asyncio.wait_for(self.closed.wait(), timeout)

    async def _receive(self) -> None:
        try:
            async for raw in self.connection:
                message = json.loads(raw)
                message["_at"] = time.monotonic()
                self.messages.append(message)
                match message["event"]:
                    case "media":
                        self._queued.append(ulaw_decode(base64.b64decode(message["media"]["payload"])))
                    case "mark":
                        self._queued.append(message["mark"]["name"])
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

    async def _line(self) -> None:
        """Every 20 ms: a frame of the caller's speech (or silence) goes up, a frame of the server's audio plays."""
        start, frames = time.monotonic(), 0
        with contextlib.suppress(websockets.ConnectionClosed):
            while True:
                up = self._speech.popleft() if self._speech else np.zeros(FRAME, np.int16)
                await self.send({"event": "media", "streamSid": self.stream_sid, "media": {
                    "track": "inbound", "chunk": str(frames + 1), "timestamp": str(frames * 20),
                    "payload": base64.b64encode(ulaw_encode(up)).decode("ascii")}})
                while self._queued and isinstance(self._queued[0], str):
                    await self._echo(str(self._queued.popleft()))
                if self._queued:
                    played = self._queued.popleft()
                    assert not isinstance(played, str)
                    self.heard.append((time.monotonic(), played))
                    while self._queued and isinstance(self._queued[0], str):  # played up to the mark
                        await self._echo(str(self._queued.popleft()))
                frames += 1
                await asyncio.sleep(max(0.0, start + frames * 0.02 - time.monotonic()))

    async def _echo(self, name: str) -> None:
        await self.send({"event": "mark", "streamSid": self.stream_sid, "mark": {"name": name}})
