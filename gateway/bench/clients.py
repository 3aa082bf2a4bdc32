"""The bench's clients: one turn at a time over Chat Completions (SSE) or the Realtime WebSocket, timed
from the client's side. Nothing here knows it talks to this gateway: any server with the protocol works."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import time
from dataclasses import dataclass
from typing import Any

import httpx
import numpy as np
import websockets

from gateway.bench.stats import TurnRecord


class BenchError(Exception):
    """A failure the run cannot go on with (unreachable server, refused key, wrong protocol): one line."""


@dataclass(frozen=True)
class Target:
    url: str  # http(s)://host:port, without /v1
    model: str
    api_key: str | None
    max_tokens: int
    seed: int | None

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    @property
    def realtime_url(self) -> str:
        return self.url.replace("http", "ws", 1) + f"/v1/realtime?model={self.model}"


def _ms(since: float, until: float | None = None) -> float:
    return round(((until if until is not None else time.perf_counter()) - since) * 1000, 2)


class DeltaTimer:
    """Times a turn's text deltas as they arrive: the first one's time (TTFT is measured from the caller's
    origin) and the gap before each later one."""

    def __init__(self) -> None:
        self.first: float | None = None
        self._last: float | None = None

    def tick(self, record: TurnRecord) -> None:
        now = time.perf_counter()
        if self._last is None:
            self.first = now
        else:
            record.itl_ms.append(_ms(self._last, now))
        self._last = now
        record.output_tokens += 1


def _error_code(status: int, body: bytes) -> str:
    try:
        return str(json.loads(body)["error"]["code"] or f"http_{status}")
    except (ValueError, KeyError, TypeError):
        return f"http_{status}"


class ChatClient:
    """Streamed Chat Completions; a session's history grows by each turn's question and answer."""

    def __init__(self, target: Target, http: httpx.AsyncClient, system_prompt: str | None) -> None:
        self.target = target
        self.http = http
        self.messages: list[dict[str, Any]] = [{"role": "system", "content": system_prompt}] if system_prompt else []

    async def turn(self, record: TurnRecord, question: str) -> None:
        self.messages.append({"role": "user", "content": question})
        body: dict[str, Any] = {"model": self.target.model, "messages": self.messages, "stream": True,
                                "max_tokens": self.target.max_tokens}
        if self.target.seed is not None:
            body["seed"] = self.target.seed
        sent = time.perf_counter()
        answer: list[str] = []
        timer = DeltaTimer()
        async with self.http.stream("POST", f"{self.target.url}/v1/chat/completions", json=body,
                                    headers=self.target.headers) as response:
            if response.status_code != 200:
                record.error = _error_code(response.status_code, await response.aread())
                return
            async for line in response.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    record.error = str(chunk["error"].get("code") or "stream_error")
                    return
                delta = (chunk.get("choices") or [{}])[0].get("delta", {}).get("content")
                if delta:
                    timer.tick(record)
                    answer.append(delta)
        record.total_ms = _ms(sent)
        record.ttft_ms = _ms(sent, timer.first) if timer.first is not None else None
        self.messages.append({"role": "assistant", "content": "".join(answer)})

    async def close(self) -> None:
        return None


class RealtimeTextClient:
    """A Realtime session over a WebSocket, text turns: item, response.create, deltas until response.done."""

    def __init__(self, target: Target, connection: websockets.ClientConnection) -> None:
        self.target = target
        self.connection = connection

    @classmethod
    async def open(cls, target: Target, system_prompt: str | None, timeout_s: float = 30) -> RealtimeTextClient:
        try:
            connection = await websockets.connect(target.realtime_url, additional_headers=target.headers,
                                                  max_size=None, open_timeout=timeout_s)
        except websockets.InvalidStatus as exc:
            status = exc.response.status_code
            raise BenchError(f"{target.realtime_url}: the WebSocket handshake was refused ({status})") from None
        except (OSError, TimeoutError, websockets.InvalidHandshake) as exc:
            raise BenchError(f"cannot open {target.realtime_url}: {exc}") from None
        client = cls(target, connection)
        first = await client._next(timeout_s)
        if first.get("type") == "error":
            await connection.close()
            error = first.get("error") or {}
            raise BenchError(f"the server refused the session: {error.get('code')}: {error.get('message')}")
        if first.get("type") != "session.created":
            await connection.close()
            raise BenchError(f"not a Realtime server: its first event was {first.get('type')!r}, not session.created")
        session: dict[str, Any] = {"type": "realtime", "output_modalities": ["text"],
                                   "max_output_tokens": target.max_tokens}
        if system_prompt:
            session["instructions"] = system_prompt
        await client.send({"type": "session.update", "session": session})
        return client

    async def send(self, event: dict[str, Any]) -> None:
        await self.connection.send(json.dumps(event))

    async def _next(self, timeout_s: float) -> dict[str, Any]:
        try:
            raw = await asyncio.wait_for(self.connection.recv(), timeout_s)
        except websockets.ConnectionClosed as exc:
            raise BenchError(f"the server closed the session ({exc.rcvd.code if exc.rcvd else 'no close frame'})") from None
        event = json.loads(raw)
        if not isinstance(event, dict):
            raise BenchError("not a Realtime server: an event was not a JSON object")
        return event

    async def turn(self, record: TurnRecord, question: str, timeout_s: float = 120) -> None:
        await self.send({"type": "conversation.item.create", "item": {
            "type": "message", "role": "user", "content": [{"type": "input_text", "text": question}]}})
        sent = time.perf_counter()
        await self.send({"type": "response.create"})
        timer = DeltaTimer()
        while True:
            event = await self._next(timeout_s)
            kind = event.get("type")
            if kind in ("response.output_text.delta", "response.output_audio_transcript.delta"):
                timer.tick(record)
            elif kind == "error":
                record.error = str((event.get("error") or {}).get("code") or "error")
            elif kind == "response.done":
                record.total_ms = _ms(sent)
                record.ttft_ms = _ms(sent, timer.first) if timer.first is not None else None
                response = event.get("response") or {}
                if response.get("status") == "failed" and record.error is None:
                    record.error = str(((response.get("status_details") or {}).get("error") or {}).get("code") or "failed")
                return

    async def close(self) -> None:
        await self.connection.close()


VOICE_RATE = 24000  # audio/pcm, the Realtime API's default format
CHUNK_MS = 20
TAIL_SILENCE_S = 1.5  # after each question: the server's VAD ends the turn in it


class RealtimeVoiceClient(RealtimeTextClient):
    """A Realtime session over a WebSocket, spoken turns: the question's audio at real-time pace in 20 ms
    chunks, then silence, with server VAD creating the response; timed from the end of the speech sent."""

    @classmethod
    async def open(cls, target: Target, system_prompt: str | None, timeout_s: float = 30) -> RealtimeVoiceClient:
        client = await super().open(target, system_prompt, timeout_s)
        assert isinstance(client, RealtimeVoiceClient)
        await client.send({"type": "session.update", "session": {"type": "realtime", "output_modalities": ["audio"],
                                                                 "audio": {"input": {"turn_detection": {"type": "server_vad"}}}}})
        return client

    async def turn(self, record: TurnRecord, question: Any, timeout_s: float = 120) -> None:
        pcm: np.ndarray = question
        speech_end: list[float] = []
        sender = asyncio.create_task(self._speak(pcm, speech_end))
        timer = DeltaTimer()
        audio_s = 0.0
        first_audio: float | None = None
        last_audio: float | None = None
        try:
            while True:
                event = await self._next(timeout_s)
                kind = event.get("type")
                now = time.perf_counter()
                if kind == "response.output_audio_transcript.delta":
                    timer.tick(record)
                elif kind == "response.output_audio.delta":
                    first_audio = first_audio or now
                    last_audio = now
                    audio_s += len(base64.b64decode(event.get("delta") or "")) / 2 / VOICE_RATE
                elif kind == "error":
                    record.error = str((event.get("error") or {}).get("code") or "error")
                elif kind == "response.done":
                    break
        except BaseException:
            sender.cancel()  # a failed or cancelled turn stops speaking at once
            raise
        finally:
            with contextlib.suppress(asyncio.CancelledError):
                await sender
        end = speech_end[0] if speech_end else time.perf_counter()
        if timer.first is not None:
            record.ttft_ms = _ms(end, timer.first)
        if first_audio is not None:
            record.first_audio_ms = record.voice_to_voice_ms = _ms(end, first_audio)
            if last_audio is not None and audio_s > 0:
                record.audio_rtf = round((last_audio - first_audio) / audio_s, 3)
        record.total_ms = _ms(end)

    async def _speak(self, pcm: np.ndarray, speech_end: list[float]) -> None:
        """Chunks leave when complete, as a microphone's would; the speech ends with its last chunk."""
        step = VOICE_RATE * CHUNK_MS // 1000
        audio = np.concatenate([pcm, np.zeros(int(VOICE_RATE * TAIL_SILENCE_S), np.int16)])
        started = time.perf_counter()
        for index, start in enumerate(range(0, len(audio), step)):
            await asyncio.sleep(max(0.0, started + (index + 1) * CHUNK_MS / 1000 - time.perf_counter()))
            chunk = audio[start:start + step]
            await self.send({"type": "input_audio_buffer.append",
                             "audio": base64.b64encode(np.ascontiguousarray(chunk).tobytes()).decode()})
            if start + step >= len(pcm) and not speech_end:
                speech_end.append(time.perf_counter())
