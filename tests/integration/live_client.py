"""A GPT-Live client for the tests: the official SDK's `client.live.connect()`, a microphone that streams 20 ms of
audio at a time as a real one does (silence between the clips it is given), and every server event checked
against openai.types.live as it arrives. Also a sideband (`client.live.sideband.connect()`) the same way."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import numpy as np
from openai import AsyncOpenAI
from openai.resources.live.live import AsyncLiveConnection
from openai.resources.live.sideband import AsyncSidebandConnection

from tests.integration.sdk_types import assert_valid_live_event

RATE = 24000
FRAME = RATE // 50


class LiveCaller:
    def __init__(self, connection: AsyncLiveConnection | AsyncSidebandConnection) -> None:
        self.connection = connection
        self.events: list[dict[str, Any]] = []  # each with "_at": time.monotonic() when it arrived
        self._arrived = asyncio.Condition()
        self._clips: asyncio.Queue[np.ndarray] = asyncio.Queue()
        self.clip_sent = asyncio.Event()  # set each time a clip has gone out whole
        self._tasks: list[asyncio.Task[None]] = []
        self.closed = False

    @classmethod
    @contextlib.asynccontextmanager
    async def connect(cls, base_url: str, session: dict[str, Any], *, microphone: bool = True,
                      api_key: str = "sk-test") -> AsyncIterator[LiveCaller]:
        client = AsyncOpenAI(base_url=f"{base_url}/v1", api_key=api_key)
        async with client.live.connect() as connection:
            caller = cls(connection)
            await caller.send({"type": "session.start", "session": session})
            if microphone:
                caller._tasks.append(asyncio.create_task(caller._stream()))
            async with caller._reading():
                yield caller

    @classmethod
    @contextlib.asynccontextmanager
    async def attach(cls, base_url: str, session_id: str, *, api_key: str = "sk-test") -> AsyncIterator[LiveCaller]:
        """A sideband watching a running session: what it hears, and what it sends to it (no microphone)."""
        client = AsyncOpenAI(base_url=f"{base_url}/v1", api_key=api_key)
        async with client.live.sideband.connect(session_id=session_id) as connection:
            caller = cls(connection)
            async with caller._reading():
                yield caller

    @contextlib.asynccontextmanager
    async def _reading(self) -> AsyncIterator[None]:
        self._tasks.insert(0, asyncio.create_task(self._read()))  # first: _reader_error reads it
        try:
            yield
        finally:
            for task in self._tasks:
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)

    async def send(self, event: dict[str, Any]) -> None:
        await self.connection.send(event)  # type: ignore[arg-type]  # a dict the SDK sends as it is

    def say(self, pcm24k: np.ndarray) -> None:
        """Queue a clip (int16 at 24 kHz) for the microphone, after what it is saying now."""
        self._clips.put_nowait(pcm24k)

    async def _stream(self) -> None:
        started = time.monotonic()
        frames = 0
        clip = np.zeros(0, np.int16)
        while True:
            if not len(clip) and not self._clips.empty():
                clip = self._clips.get_nowait()
            chunk, clip = (clip[:FRAME], clip[FRAME:]) if len(clip) else (np.zeros(FRAME, np.int16), clip)
            if len(chunk) < FRAME:
                chunk = np.concatenate([chunk, np.zeros(FRAME - len(chunk), np.int16)])
                self.clip_sent.set()
            await self.send({"type": "session.input_audio.append", "audio": base64.b64encode(chunk.tobytes()).decode()})
            frames += 1
            await asyncio.sleep(max(0.0, started + frames * 0.02 - time.monotonic()))

    async def _read(self) -> None:
        try:
            while True:
                event = json.loads(await self.connection.recv_bytes())
                assert_valid_live_event(event)
                event["_at"] = time.monotonic()
                async with self._arrived:
                    self.events.append(event)
                    self._arrived.notify_all()
        except Exception:  # the connection closed (or an event failed its check: the waits report it)
            async with self._arrived:
                self.closed = True
                self._arrived.notify_all()
            raise

    def of_type(self, kind: str) -> list[dict[str, Any]]:
        return [event for event in self.events if event["type"] == kind]

    async def wait_for(self, kind: str, *, count: int = 1, timeout: float = 30.0,
                       where: Callable[[dict[str, Any]], bool] = lambda event: True) -> dict[str, Any]:
        """The `count`-th event of this type (that `where` accepts)."""
        async def arrived() -> dict[str, Any]:
            async with self._arrived:
                while True:
                    found = [event for event in self.of_type(kind) if where(event)]
                    if len(found) >= count:
                        return found[count - 1]
                    if self.closed:
                        raise AssertionError(f"the connection closed before {kind}: {self._reader_error()}")
                    await self._arrived.wait()
        try:
            return await asyncio.wait_for(arrived(), timeout)
        except TimeoutError:
            raise AssertionError(f"no {kind} within {timeout} s; got {[e['type'] for e in self.events][-30:]}") from None

    def _reader_error(self) -> BaseException | None:
        reader = self._tasks[0]
        return reader.exception() if reader.done() and not reader.cancelled() else None

    def said(self) -> str:
        return "".join(event["delta"] for event in self.of_type("session.output_transcript.delta"))

    def heard(self) -> str:
        return "".join(event["delta"] for event in self.of_type("session.input_transcript.delta"))

    def audio(self, since: float = 0.0) -> np.ndarray:
        """The assistant's audio (audio/pcm at 24 kHz) that arrived after `since` (time.monotonic())."""
        deltas = [base64.b64decode(e["delta"]) for e in self.of_type("session.output_audio.delta") if e["_at"] > since]
        return np.frombuffer(b"".join(deltas), np.int16)
