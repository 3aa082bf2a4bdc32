"""The bench's clients: one turn at a time over Chat Completions (SSE) or the Realtime WebSocket, timed
from the client's side; and the clock probe before a run. Nothing here knows it talks to this gateway: any
server with the protocol works (latency marks and /healthz's clock are used when a server has them)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import websockets

from gateway.bench.stages import TEXT_CHAIN, ClockOffset, choose_offset, parse_marks, turn_stages
from gateway.bench.stats import TurnRecord

REFUSAL_WAIT_S = 2.0  # how long a turn waits for a response after an error, before it counts as refused


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


def check_session_created(event: object, what: str) -> None:
    """A Realtime session's first event: session.created, else BenchError (an error event: the server refused
    the session). `what`: "server" or "call", for the message."""
    kind = event.get("type") if isinstance(event, dict) else None
    if kind == "error":
        assert isinstance(event, dict)
        raw = event.get("error")
        error: dict[str, Any] = raw if isinstance(raw, dict) else {}
        raise BenchError(f"the server refused the session: {error.get('code')}: {error.get('message')}",
                         str(error.get("code") or "session_refused"))
    if kind != "session.created":
        was = f"was {kind!r}, not" if kind is not None else "was not"
        raise BenchError(f"not a Realtime {what}: its first event {was} session.created")


@dataclass
class ChatStream:
    """What a streamed chat completion sent, timed as it arrived (perf_counter)."""

    error: str | None = None  # an error code: of a refusal (its HTTP status's body), or of an error chunk
    first: float | None = None  # the first chunk with text
    finished: float | None = None  # the chunk with a finish_reason
    text: list[str] = field(default_factory=list)
    usage: dict[str, Any] = field(default_factory=dict)  # the usage chunk's (stream_options.include_usage)


async def stream_chat(http: httpx.AsyncClient, url: str, body: dict[str, Any], headers: dict[str, str] | None = None,
                      on_text: Callable[[float], None] | None = None) -> ChatStream:
    """POST a streamed chat completion and read its SSE to the end (or an error chunk); `on_text` is told when
    each text delta arrived. A malformed chunk raises (ValueError, KeyError, ...: runner.BAD_RESPONSE)."""
    stream = ChatStream()
    async with http.stream("POST", url, json=body, headers=headers) as response:
        if response.status_code != 200:
            stream.error = error_code(response.status_code, await response.aread())
            return stream
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if "error" in chunk:
                stream.error = str(chunk["error"].get("code") or "stream_error")
                return stream
            stream.usage = chunk.get("usage") or stream.usage
            for choice in chunk.get("choices") or []:
                at = time.perf_counter()
                if delta := choice.get("delta", {}).get("content"):
                    stream.first = stream.first if stream.first is not None else at
                    stream.text.append(delta)
                    if on_text is not None:
                        on_text(at)
                if choice.get("finish_reason"):
                    stream.finished = at
    return stream


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
        timer = DeltaTimer()
        stream = await stream_chat(self.http, f"{self.target.url}/v1/chat/completions", body, self.target.headers,
                                   on_text=lambda at: timer.tick(record, at))
        if stream.error is not None:
            record.error = stream.error
            return
        record.total_ms = elapsed_ms(sent)
        record.ttft_ms = elapsed_ms(sent, timer.first) if timer.first is not None else None
        self.messages.append({"role": "assistant", "content": "".join(stream.text)})

    async def close(self) -> None:
        return None


class RealtimeTextClient:
    """A Realtime session over a WebSocket, text turns: item, response.create, deltas until response.done."""

    def __init__(self, target: Target, connection: websockets.ClientConnection) -> None:
        self.target = target
        self.connection = connection

    @classmethod
    async def open(cls, target: Target, system_prompt: str | None, timeout_s: float = 30,
                   spoken: bool = False, configure: bool = True) -> RealtimeTextClient:
        """`spoken`: answers in audio, turns ended by the server's VAD (RealtimeVoiceClient). `configure`: False
        sends no session.update (the server's defaults, and no system prompt)."""
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
            first = await client.next_event(timeout_s)
        except TimeoutError:
            await connection.close()
            raise BenchError(f"not a Realtime server: {target.realtime_url} sent no session.created "
                             f"within {timeout_s:g} s") from None
        except ValueError:
            await connection.close()
            raise BenchError("not a Realtime server: its first event was not a JSON object") from None
        try:
            check_session_created(first, "server")
        except BenchError:
            await connection.close()
            raise
        if not configure:
            return client
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

    async def next_event(self, timeout_s: float) -> dict[str, Any]:
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
        started = False
        while True:
            try:
                # After an error with no response begun, a refused response.create: no response.done comes.
                event = await self.next_event(timeout_s if started or record.error is None else REFUSAL_WAIT_S)
            except TimeoutError:
                if started or record.error is None:
                    raise
                record.total_ms = elapsed_ms(sent)
                return
            kind = event.get("type")
            if kind == "response.created":
                started = True
            elif kind in ("response.output_text.delta", "response.output_audio_transcript.delta"):
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
