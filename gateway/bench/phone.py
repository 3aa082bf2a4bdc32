"""What the phone modes share (`--mode twilio`, `telnyx`, `plivo`, `sip`): a call whose events an application watches on its
sideband (`/v1/realtime?call_id=...`, as OpenAI has it for calls) and whose answer is the loud 20 ms frames the
caller's line plays (Playback, as for a WebRTC call)."""

from __future__ import annotations

import asyncio
import json
import time
from abc import abstractmethod
from typing import Any, Self

import numpy as np
import websockets

from gateway.bench.clients import BenchError, Target
from gateway.bench.voice import Microphone, SpokenClient
from gateway.bench.webrtc import LOUD_RMS, Playback

RATE = 8000  # G.711's
FRAME_S = 0.02
FRAME = int(RATE * FRAME_S)
SIDEBAND_TIMEOUT_S = 30.0
# A line plays what it holds within a tick of its arrival and a clear empties it: a reply's frames end with its
# playout, and the next reply (its words made ahead, on a fast host) may start 0.3 s after a cut.
PLAYED_TAIL_S = 0.1


async def watch(url: str, call_id: str, headers: dict[str, str], timeout_s: float = SIDEBAND_TIMEOUT_S
                ) -> websockets.ClientConnection:
    """The application's sideband on the call, once the call's session is open (its session.update answered);
    `url`: the server's http(s)://host:port."""
    deadline = time.monotonic() + timeout_s
    while True:
        sideband = await websockets.connect(f"{url.replace('http', 'ws', 1)}/v1/realtime?call_id={call_id}",
                                            additional_headers=headers, max_size=None)
        try:
            await sideband.send(json.dumps({"type": "session.update", "session": {"type": "realtime"}}))
            answer = json.loads(await asyncio.wait_for(sideband.recv(), timeout_s))
        except websockets.ConnectionClosed:  # refused and closed before our update went out: the close says why
            answer = {"type": "error", "error": {"code": sideband.close_reason}}
        if answer.get("type") == "session.updated":
            return sideband
        await sideband.close()
        error = answer.get("error") or {}
        if answer.get("type") != "error" or error.get("code") != "call_not_found":
            raise BenchError(f"the call's sideband was refused: {error.get('code')}", str(error.get("code")))
        if time.monotonic() > deadline:
            raise BenchError(f"the call's session did not open in {timeout_s:.0f} s", "call_not_found")
        await asyncio.sleep(0.1)


def session_config(target: Target, system_prompt: str | None) -> dict[str, Any]:
    """The session the bench's application opens on each call (the server's VAD)."""
    session: dict[str, Any] = {"model": target.model, "max_output_tokens": target.max_tokens,
                               "audio": {"input": {"turn_detection": {"type": "server_vad"}}}}
    if system_prompt:
        session["instructions"] = system_prompt
    return session


class PhoneCallClient(SpokenClient):
    """Spoken turns over a phone line; the answer plays at real-time pace on the line, so a turn ends when its
    playout does (output_audio_buffer.stopped). A subclass dials, calls `played` for each 20 ms frame the line
    plays and `watching` once the call's sideband is open."""

    plays_out = True

    def __init__(self, target: Target, barge_in_after_s: float | None) -> None:
        super().__init__(target, Microphone(RATE, tail_s=0, always_on=True), barge_in_after_s)
        self.playback = Playback(tail_s=PLAYED_TAIL_S)
        self.sideband: websockets.ClientConnection | None = None
        self.loud_s = 0.0
        self._events: asyncio.Task[None] | None = None

    @abstractmethod
    async def _call(self, system_prompt: str | None) -> None:
        """Dial, and watch the call's sideband (`watching`)."""

    async def _dialled(self, system_prompt: str | None) -> Self:
        """This client with its call made; closed, and the error raised, when it could not be."""
        try:
            await self._call(system_prompt)
        except BaseException:
            await self.close()
            raise
        return self

    def played(self, at: float, pcm: np.ndarray) -> None:
        loud = bool(pcm.size) and float(np.sqrt(np.mean(pcm.astype(np.float64) ** 2))) > LOUD_RMS
        self.loud_s += FRAME_S if loud else 0.0
        for received in self.playback.frame(at, FRAME_S, loud):
            self._inbox.put_nowait(received)

    def watching(self, sideband: websockets.ClientConnection) -> None:
        self.sideband = sideband
        self._events = asyncio.create_task(self._read_events(sideband))

    async def _read_events(self, sideband: websockets.ClientConnection) -> None:
        try:
            async for raw in sideband:
                at = time.perf_counter()
                try:
                    event = json.loads(raw)
                except ValueError:
                    event = None
                if not isinstance(event, dict):
                    self._inbox.put_nowait(ValueError("an event was not a JSON object"))
                    continue
                for received in self.playback.event(at, event):
                    self._inbox.put_nowait(received)
        except websockets.ConnectionClosed:
            pass
        self._inbox.put_nowait(BenchError("the server closed the call's sideband"))

    async def send(self, event: dict[str, Any]) -> None:
        assert self.sideband is not None
        await self.sideband.send(json.dumps(event))

    def audio_stats(self) -> dict[str, Any]:
        return {"loud_audio_s": round(self.loud_s, 2), "stray_loud_audio_ms": round(1000 * self.playback.stray_loud_s, 1)}

    async def close(self) -> None:
        if self._events is not None:
            self._events.cancel()
            await asyncio.gather(self._events, return_exceptions=True)
        if self.sideband is not None:
            await self.sideband.close()
