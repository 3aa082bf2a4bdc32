"""--mode live: spoken turns over GPT-Live's WebSocket (/v1/live/sessions), measured as --mode voice measures Realtime.

Live has no responses on the wire: the server decides the turns and paces the assistant's audio in real time. So
this client marks them itself, from what it hears: an answer begins with the first audio after a silence and
is over once its audio has stopped for QUIET_S (SpokenTurn's rule for audio that plays out); an answer whose
audio stops while the microphone is speaking was cut by it (the barge-in). Live sends no latency marks, so a
live run has voice-to-voice and barge-in but no server stages; and its words follow the audio as it plays, so
they time nothing the audio does not (no ttft or inter-token figures).
"""

from __future__ import annotations

import asyncio
import base64
import json
import time
from typing import Any

import websockets

from gateway.bench.clients import BenchError, Target, error_code
from gateway.bench.voice import VOICE_RATE, AudioIn, Microphone, Received, SpokenClient

LIVE_MODEL = "gpt-live-1"
ANSWER_GAP_S = 1.0  # audio again after this much silence is a new answer
CUT_S = 0.3  # an answer silent this long while the microphone speaks was cut by it
WATCH_S = 0.05


class LiveAnswers:
    """The answers in a Live session's events, as the Realtime events SpokenTurn folds (an answer is a response,
    its audio AudioIn), from what arrives and what the watch sees. No I/O."""

    def __init__(self) -> None:
        self._count = 0
        self.answer: str | None = None  # the answer being heard
        self._last_audio = 0.0
        self._cut = False

    def heard(self, at: float, event: dict[str, Any]) -> list[Received]:
        kind = event.get("type")
        if kind == "error":
            return [(at, event)]
        if kind != "session.output_audio.delta":
            return []
        out: list[Received] = []
        if self.answer is None:
            self._count += 1
            self.answer, self._cut = f"live_answer_{self._count}", False
            # Done as it starts: a Live answer is over when its audio is (SpokenTurn's QUIET_S).
            out += [(at, {"type": opened, "response": {"id": self.answer, "status": "completed"}})
                    for opened in ("response.created", "response.done")]
        self._last_audio = at
        seconds = len(base64.b64decode(event.get("delta") or "")) / 2 / VOICE_RATE
        return [*out, (at, AudioIn(seconds, self.answer))]

    def watch(self, now: float, speaking: bool) -> list[Received]:
        """At `now`: an answer whose audio stopped while the microphone was `speaking` was cut by it; one silent
        for ANSWER_GAP_S is over."""
        if self.answer is None:
            return []
        out: list[Received] = []
        silent = now - self._last_audio
        if silent >= CUT_S and speaking and not self._cut:
            self._cut = True
            out.append((self._last_audio, {"type": "output_audio_buffer.cleared", "response_id": self.answer}))
        if silent >= ANSWER_GAP_S:
            self.answer = None
        return out


class LiveVoiceClient(SpokenClient):
    plays_out = True  # the server paces the audio: it ends as it plays

    def __init__(self, target: Target, connection: websockets.ClientConnection,
                 barge_in_after_s: float | None) -> None:
        super().__init__(target, Microphone(VOICE_RATE, 0, always_on=True), barge_in_after_s)
        self.connection = connection
        self._answers = LiveAnswers()
        self._tasks = [asyncio.create_task(self._read()), asyncio.create_task(self._send_audio()),
                       asyncio.create_task(self._watch())]

    @classmethod
    async def open(cls, target: Target, system_prompt: str | None, barge_in_after_s: float | None,
                   timeout_s: float = 30) -> LiveVoiceClient:
        url = target.url.replace("http", "ws", 1) + "/v1/live/sessions"
        try:
            connection = await websockets.connect(url, additional_headers=target.headers, max_size=None,
                                                  open_timeout=timeout_s)
        except websockets.InvalidStatus as exc:
            status = exc.response.status_code
            raise BenchError(f"{url}: the WebSocket handshake was refused ({status})",
                             error_code(status, exc.response.body or b"")) from None
        except (OSError, TimeoutError, websockets.InvalidHandshake) as exc:
            raise BenchError(f"cannot open {url}: {exc}") from None
        session: dict[str, Any] = {"model": LIVE_MODEL}
        if system_prompt:
            session["instructions"] = system_prompt
        try:
            await connection.send(json.dumps({"type": "session.start", "session": session}))
            first = json.loads(await asyncio.wait_for(connection.recv(), timeout_s))
        except (TimeoutError, ValueError, websockets.ConnectionClosed):
            await connection.close()
            raise BenchError(f"not a GPT-Live server: {url} sent no session.started") from None
        if not isinstance(first, dict) or first.get("type") != "session.started":
            await connection.close()
            code = (first.get("error") or {}).get("code") if isinstance(first, dict) else None
            raise BenchError(f"{url} did not start the session: {str(first)[:200]}", str(code or "session_open_failed"))
        return cls(target, connection, barge_in_after_s)

    async def send(self, event: dict[str, Any]) -> None:
        await self.connection.send(json.dumps(event))

    async def _send_audio(self) -> None:
        while (chunk := await self.mic.next_chunk()) is not None:
            try:
                await self.send({"type": "session.input_audio.append",
                                 "audio": base64.b64encode(chunk.tobytes()).decode()})
            except websockets.ConnectionClosed:
                return  # the reader reports it

    async def _read(self) -> None:
        try:
            async for raw in self.connection:
                event = json.loads(raw)
                if not isinstance(event, dict):
                    self._inbox.put_nowait(ValueError("an event was not a JSON object"))
                    return
                self._heard(time.perf_counter(), event)
        except websockets.ConnectionClosed:
            pass
        except ValueError:
            self._inbox.put_nowait(ValueError("an event was not JSON"))
            return
        code = self.connection.close_code if self.connection.close_code is not None else "no close frame"
        self._inbox.put_nowait(BenchError(f"the server closed the session ({code})"))

    def _heard(self, at: float, event: dict[str, Any]) -> None:
        for received in self._answers.heard(at, event):
            self._inbox.put_nowait(received)

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(WATCH_S)
            for received in self._answers.watch(time.perf_counter(), self.mic.pending):
                self._inbox.put_nowait(received)

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.connection.close()
