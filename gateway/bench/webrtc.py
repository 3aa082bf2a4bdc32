"""`--mode webrtc`: a Realtime call made with aiortc the way OpenAI's browser page makes it.

An ephemeral key from POST /v1/realtime/client_secrets, the SDP offer to POST /v1/realtime/calls (201, the
SDP answer and a Location), events on the `oai-events` data channel, the microphone as a 48 kHz track and
the answer on the server's track, where the server decides what the caller hears: answer audio is a loud
received frame. The call ends with POST {Location}/hangup.
"""

from __future__ import annotations

import asyncio
import contextlib
import fractions
import ipaddress
import json
import time
from typing import Any

import aioice.ice
import httpx
import numpy as np
from aiortc import MediaStreamTrack, RTCConfiguration, RTCPeerConnection, RTCSessionDescription
from aiortc.mediastreams import MediaStreamError
from av import AudioFrame

from gateway.bench.clients import BenchError, Target, error_code
from gateway.bench.voice import AudioIn, Microphone, SpokenClient

RTC_RATE = 48000  # Opus's rate: the microphone track sends it, the server's track comes back at it
LOUD_RMS = 300.0  # int16 RMS of a received frame that counts as answer audio (the decoder's silence is ~0)


def offer_loopback_if_local(url: str) -> None:
    """aioice never offers a loopback address, so a server on loopback could not be reached: offer only that.
    (The gateway's own helper, gateway.api.transports.webrtc.offer_host_addresses, would import torch here.)"""
    host = httpx.URL(url).host
    try:
        loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        return  # a name: aioice's own addresses reach it
    if loopback:
        address = "::1" if ":" in host else "127.0.0.1"
        aioice.ice.get_host_addresses = lambda use_ipv4, use_ipv6: (  # type: ignore[assignment]
            [address] if (use_ipv6 if ":" in address else use_ipv4) else [])


class MicrophoneTrack(MediaStreamTrack):
    """aiortc's sender pulls 20 ms frames; each leaves when complete by the wall clock, silence between clips."""

    kind = "audio"

    def __init__(self, mic: Microphone) -> None:
        super().__init__()
        self.mic = mic
        self._started: float | None = None
        self._samples = 0

    async def recv(self) -> AudioFrame:
        if self._started is None:
            self._started = time.perf_counter()
        due = self._started + (self._samples + self.mic.chunk) / self.mic.rate
        await asyncio.sleep(max(0.0, due - time.perf_counter()))
        pcm = self.mic.take(time.perf_counter())
        frame = AudioFrame.from_ndarray((pcm if pcm is not None else np.zeros(self.mic.chunk, np.int16)).reshape(1, -1),
                                        format="s16", layout="mono")
        frame.sample_rate = self.mic.rate
        frame.pts = self._samples
        frame.time_base = fractions.Fraction(1, self.mic.rate)
        self._samples += self.mic.chunk
        return frame


class RealtimeCallClient(SpokenClient):
    """A Realtime session over a WebRTC call, spoken turns; the answer plays at real-time pace, so a turn
    ends when its playout does (output_audio_buffer.stopped), and the next question is not spoken over it."""

    plays_out = True

    def __init__(self, target: Target, http: httpx.AsyncClient, barge_in_after_s: float | None) -> None:
        super().__init__(target, Microphone(RTC_RATE, tail_s=0), barge_in_after_s)  # the track sends silence anyway
        self.http = http
        self.pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))  # host candidates only: no STUN to reach
        self.secret: str | None = None
        self.call_url: str | None = None
        self._tasks: list[asyncio.Task[None]] = []

    @classmethod
    async def open(cls, target: Target, http: httpx.AsyncClient, system_prompt: str | None,
                   barge_in_after_s: float | None, timeout_s: float = 30) -> RealtimeCallClient:
        offer_loopback_if_local(target.url)
        client = cls(target, http, barge_in_after_s)
        try:
            await client._call(system_prompt, timeout_s)
        except BaseException:
            await client.close()
            raise
        return client

    async def _call(self, system_prompt: str | None, timeout_s: float) -> None:
        url = self.target.url
        channel = self.pc.createDataChannel("oai-events")
        opened = asyncio.Event()
        channel.on("open", opened.set)
        channel.on("message", self._on_message)
        channel.on("close", lambda: self._inbox.put_nowait(BenchError("the server closed the call's data channel")))
        self.pc.addTrack(MicrophoneTrack(self.mic))
        self.pc.on("track", self._on_track)
        await self.pc.setLocalDescription(await self.pc.createOffer())  # gathers every candidate first
        session: dict[str, Any] = {"type": "realtime", "model": self.target.model, "output_modalities": ["audio"],
                                   "max_output_tokens": self.target.max_tokens,
                                   "audio": {"input": {"turn_detection": {"type": "server_vad"}}}}
        if system_prompt:
            session["instructions"] = system_prompt
        minted = await self._post(f"{url}/v1/realtime/client_secrets", json={"session": session},
                                  headers=self.target.headers)
        if minted.status_code in (401, 403):
            raise BenchError(f"{url} refused the key ({minted.status_code})")
        if minted.status_code != 200:
            code = error_code(minted.status_code, minted.content)
            raise BenchError(f"{url}/v1/realtime/client_secrets answered {minted.status_code} ({code})", code)
        try:
            self.secret = str(minted.json()["value"])
        except (ValueError, KeyError, TypeError):
            raise BenchError(f"{url}/v1/realtime/client_secrets did not answer a client secret") from None
        answer = await self._post(f"{url}/v1/realtime/calls", content=self.pc.localDescription.sdp,
                                  headers={"content-type": "application/sdp", "authorization": f"Bearer {self.secret}"})
        if answer.status_code != 201:
            code = error_code(answer.status_code, answer.content)
            raise BenchError(f"{url}/v1/realtime/calls answered {answer.status_code}, not 201 ({code})", code)
        location = answer.headers.get("location")
        if not location:
            raise BenchError(f"{url}/v1/realtime/calls answered without a Location header")
        self.call_url = str(httpx.URL(url).join(location))
        try:
            await self.pc.setRemoteDescription(RTCSessionDescription(sdp=answer.text, type="answer"))
            await asyncio.wait_for(opened.wait(), timeout_s)
        except ValueError as exc:
            raise BenchError(f"{url}/v1/realtime/calls answered an SDP that cannot be used: {exc}") from None
        except TimeoutError:
            raise BenchError(f"the call to {url} did not connect in {timeout_s:.0f} s (no ICE path?)") from None
        try:
            first = await self._receive(timeout_s)
        except ValueError:
            raise BenchError("not a Realtime call: its first event was not a JSON object") from None
        event = first[1] if first is not None else None
        if isinstance(event, dict) and event.get("type") == "error":
            raw = event.get("error")
            error: dict[str, Any] = raw if isinstance(raw, dict) else {}
            raise BenchError(f"the server refused the session: {error.get('code')}: {error.get('message')}",
                             str(error.get("code") or "session_refused"))
        if not isinstance(event, dict) or event.get("type") != "session.created":
            raise BenchError("not a Realtime call: its first event was not session.created")

    async def _post(self, url: str, **kwargs: Any) -> httpx.Response:
        try:
            return await self.http.post(url, **kwargs)
        except httpx.HTTPError as exc:
            raise BenchError(f"cannot reach {self.target.url}: {exc}") from None

    def _on_message(self, message: str | bytes) -> None:
        at = time.perf_counter()
        try:
            event = json.loads(message)
        except ValueError:
            event = None
        if not isinstance(event, dict):
            self._inbox.put_nowait(ValueError("an event was not a JSON object"))
            return
        self._inbox.put_nowait((at, event))

    def _on_track(self, track: MediaStreamTrack) -> None:
        if track.kind == "audio":
            self._tasks.append(asyncio.create_task(self._listen(track)))

    async def _listen(self, track: MediaStreamTrack) -> None:
        while True:
            try:
                frame = await track.recv()
            except MediaStreamError:
                return
            assert isinstance(frame, AudioFrame)  # an audio track's
            pcm = frame.to_ndarray().astype(np.float64)
            if pcm.size and float(np.sqrt(np.mean(pcm**2))) > LOUD_RMS:
                self._inbox.put_nowait((time.perf_counter(), AudioIn(frame.samples / frame.sample_rate, None)))

    async def close(self) -> None:
        if self.call_url is not None:
            headers = self.target.headers or {"Authorization": f"Bearer {self.secret}"}
            with contextlib.suppress(httpx.HTTPError):
                await self.http.post(f"{self.call_url}/hangup", headers=headers)
        await self.pc.close()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
