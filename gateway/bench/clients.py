"""The bench's clients: one turn at a time over Chat Completions (SSE) or the Realtime WebSocket, timed
from the client's side; and the clock probe before a run. Nothing here knows it talks to this gateway: any
server with the protocol works (latency marks and /healthz's clock are used when a server has them)."""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from typing import Any

import httpx
import websockets

from gateway.bench.stages import TEXT_CHAIN, ClockOffset, choose_offset, parse_marks, turn_stages
from gateway.bench.stats import TurnRecord


class BenchError(Exception):
    """A failure the run cannot go on with (unreachable server, refused key, wrong protocol): one line.
    Mid-run, a session that cannot open fails alone, counted under `code` (the server's, when it gave one)."""

    def __init__(self, message: str, code: str = "session_open_failed") -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class Target:
    url: str  # http(s)://host:port, without /v1
    model: str
    api_key: str | None
    max_tokens: int
    seed: int | None
    clock: ClockOffset | None = None  # None: the server gives no clock (no cross-clock stages)

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    @property
    def realtime_url(self) -> str:
        return self.url.replace("http", "ws", 1) + f"/v1/realtime?model={self.model}"


def elapsed_ms(since: float, until: float | None = None) -> float:
    return round(((until if until is not None else time.perf_counter()) - since) * 1000, 2)


class DeltaTimer:
    """Times a turn's text deltas as they arrive: the first one's time (TTFT is measured from the caller's
    origin) and the gap before each later one."""

    def __init__(self) -> None:
        self.first: float | None = None
        self._last: float | None = None

    def tick(self, record: TurnRecord, now: float) -> None:
        if self._last is None:
            self.first = now
        else:
            record.itl_ms.append(elapsed_ms(self._last, now))
        self._last = now
        record.output_tokens += 1


async def probe_clock(http: httpx.AsyncClient, target: Target, probes: int = 8) -> ClockOffset | None:
    """The server's clock against ours, from /healthz's time_ms; None when the server does not give it."""
    samples: list[tuple[float, float, float]] = []
    for _ in range(probes):
        sent = time.time() * 1000
        try:
            response = await http.get(f"{target.url}/healthz")  # a public endpoint: the key stays home
            received = time.time() * 1000
            server = response.json().get("time_ms")
        except (httpx.HTTPError, ValueError, AttributeError):  # unreachable, not JSON, not an object
            return None
        if not isinstance(server, int | float):
            return None
        samples.append((sent, float(server), received))
    return choose_offset(samples, perf_to_wall_ms=(time.time() - time.perf_counter()) * 1000)


def error_code(status: int, body: bytes) -> str:
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
                record.error = error_code(response.status_code, await response.aread())
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
                    timer.tick(record, time.perf_counter())
                    answer.append(delta)
        record.total_ms = elapsed_ms(sent)
        record.ttft_ms = elapsed_ms(sent, timer.first) if timer.first is not None else None
        self.messages.append({"role": "assistant", "content": "".join(answer)})

    async def close(self) -> None:
        return None


class RealtimeTextClient:
    """A Realtime session over a WebSocket, text turns: item, response.create, deltas until response.done."""

    def __init__(self, target: Target, connection: websockets.ClientConnection) -> None:
        self.target = target
        self.connection = connection

    @classmethod
    async def open(cls, target: Target, system_prompt: str | None, timeout_s: float = 30,
                   spoken: bool = False) -> RealtimeTextClient:
        """`spoken`: answers in audio, turns ended by the server's VAD (RealtimeVoiceClient)."""
        try:
            connection = await websockets.connect(target.realtime_url, additional_headers=target.headers,
                                                  max_size=None, open_timeout=timeout_s)
        except websockets.InvalidStatus as exc:  # a session bound is refused before the upgrade, with its code
            status = exc.response.status_code
            raise BenchError(f"{target.realtime_url}: the WebSocket handshake was refused ({status})",
                             error_code(status, exc.response.body or b"")) from None
        except (OSError, TimeoutError, websockets.InvalidHandshake) as exc:
            raise BenchError(f"cannot open {target.realtime_url}: {exc}") from None
        client = cls(target, connection)
        try:
            first = await client._next(timeout_s)
        except TimeoutError:
            await connection.close()
            raise BenchError(f"not a Realtime server: {target.realtime_url} sent no session.created "
                             f"within {timeout_s:g} s") from None
        except ValueError:
            await connection.close()
            raise BenchError("not a Realtime server: its first event was not a JSON object") from None
        if first.get("type") == "error":
            await connection.close()
            raw = first.get("error")
            error: dict[str, Any] = raw if isinstance(raw, dict) else {}
            raise BenchError(f"the server refused the session: {error.get('code')}: {error.get('message')}",
                             str(error.get("code") or "session_refused"))
        if first.get("type") != "session.created":
            await connection.close()
            raise BenchError(f"not a Realtime server: its first event was {first.get('type')!r}, not session.created")
        session: dict[str, Any] = {"type": "realtime", "output_modalities": ["audio" if spoken else "text"],
                                   "max_output_tokens": target.max_tokens}
        if spoken:
            session["audio"] = {"input": {"turn_detection": {"type": "server_vad"}}}
        if system_prompt:
            session["instructions"] = system_prompt
        try:
            await client.send({"type": "session.update", "session": session})
        except websockets.ConnectionClosed:
            raise BenchError("the server closed the session as it opened", "connection_closed") from None
        return client

    async def send(self, event: dict[str, Any]) -> None:
        await self.connection.send(json.dumps(event))

    async def _next(self, timeout_s: float) -> dict[str, Any]:
        try:
            raw = await asyncio.wait_for(self.connection.recv(), timeout_s)
        except websockets.ConnectionClosed as exc:
            raise BenchError(f"the server closed the session ({exc.rcvd.code if exc.rcvd else 'no close frame'})") from None
        event = json.loads(raw)  # ValueError: a bad response (runner.BAD_RESPONSE)
        if not isinstance(event, dict):
            raise ValueError("an event was not a JSON object")
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
                timer.tick(record, time.perf_counter())
            elif kind == "error":
                record.error = str((event.get("error") or {}).get("code") or "error")
            elif kind == "response.done":
                record.total_ms = elapsed_ms(sent)
                record.ttft_ms = elapsed_ms(sent, timer.first) if timer.first is not None else None
                response = event.get("response") or {}
                record.stages = turn_stages(parse_marks(response), TEXT_CHAIN, start=sent, end=timer.first,
                                            clock=self.target.clock)
                if response.get("status") == "failed" and record.error is None:
                    record.error = str(((response.get("status_details") or {}).get("error") or {}).get("code") or "failed")
                return

    async def close(self) -> None:
        await self.connection.close()
