"""`--mode webrtc`: a Realtime call made with aiortc the way OpenAI's browser page makes it.

An ephemeral key from POST /v1/realtime/client_secrets, the SDP offer to POST /v1/realtime/calls (201, the
SDP answer and a Location), events on the `oai-events` data channel, the microphone as a 48 kHz track and
the answer on the server's track, where the server decides what the caller hears: answer audio is a loud
received frame. The call ends with POST {Location}/hangup. benchmarks/voice.py makes its calls here too, with
Playback (which response a frame is heard as) and the call's link statistics.
"""

from __future__ import annotations

import asyncio
import contextlib
import fractions
import ipaddress
import json
import time
from dataclasses import dataclass
from typing import Any

import aioice.ice
import httpx
import numpy as np
from aiortc import MediaStreamTrack, RTCConfiguration, RTCPeerConnection, RTCSessionDescription
from aiortc.mediastreams import MediaStreamError
from av import AudioFrame

from gateway.bench.clients import BenchError, Target, check_session_created, error_code
from gateway.bench.stages import parse_marks
from gateway.bench.stats import describe
from gateway.bench.voice import AudioIn, Microphone, Received, SpokenClient, Timed

RTC_RATE = 48000  # Opus's rate: the microphone track sends it, the server's track comes back at it
LOUD_RMS = 300.0  # int16 RMS of a received frame that counts as answer audio (the decoder's silence is ~0)
# After output_audio_buffer.stopped/cleared, frames the gateway had already sent are still on their way (aiortc's
# receive jitter buffer alone holds 4, 80 ms): a response owns the loud frames that arrive until this long passed
# with none (Playback).
TAIL_S = 0.5


def offer_loopback_if_local(url: str) -> None:
    """aioice never offers a loopback address, so a server on loopback could not be reached: offer only that.
    (The gateway's own helper, gateway.api.transports.webrtc.offer_host_addresses, would import torch here.)"""
    host = httpx.URL(url).host
    try:
        loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        return  # a name: aioice's own addresses reach it
    if loopback:
        offer_only("::1" if ":" in host else "127.0.0.1")


def offer_only(address: str) -> None:
    """Make this process's aioice offer `address` as its only host candidate."""
    aioice.ice.get_host_addresses = lambda use_ipv4, use_ipv6: (  # type: ignore[assignment]
        [address] if (use_ipv6 if ":" in address else use_ipv4) else [])


class MicrophoneTrack(MediaStreamTrack):
    """aiortc's sender pulls 20 ms frames; each leaves when complete by the wall clock, silence between clips."""

    kind = "audio"

    def __init__(self, mic: Microphone) -> None:
        super().__init__()
        self.mic = mic

    async def recv(self) -> AudioFrame:
        pcm = await self.mic.next_chunk()  # an always-on microphone: never None
        frame = AudioFrame.from_ndarray((pcm if pcm is not None else np.zeros(self.mic.chunk, np.int16)).reshape(1, -1),
                                        format="s16", layout="mono")
        frame.sample_rate = self.mic.rate
        frame.pts = self.mic.samples - self.mic.chunk
        frame.time_base = fractions.Fraction(1, self.mic.rate)
        return frame


@dataclass
class Playing:
    """One response's audio as the caller hears it (Playback)."""

    id: str
    ended: float | None = None  # output_audio_buffer.stopped or .cleared arrived
    last_loud: float | None = None
    done: Timed | None = None  # its response.done, held until its playout ended

    def over(self, now: float, tail_s: float) -> bool:
        """The playout ended, and no frame of it has arrived for `tail_s`."""
        return self.ended is not None and now - max(self.ended, self.last_loud or 0.0) >= tail_s


class Playback:
    """Which response the caller is hearing, from a gateway's call (its latency marks say which responses have
    audio): loud frames become audio of that response, and a response.done comes when its playout ended. No I/O.

    The gateway plays one reply at a time, so a loud frame belongs to the oldest response still playing: from
    its response.created until `tail_s` with no loud frame after its output_audio_buffer.stopped/cleared (a new
    reply needs the caller to speak and the VAD to wait for silence, so it never starts playing that soon). Its
    response.done, which the gateway sends once everything is generated (often seconds before the caller has
    heard it all), is handed on, with its own arrival time, after the stopped/cleared event.
    """

    def __init__(self, tail_s: float = TAIL_S) -> None:
        """`tail_s`: how long after its end a response's frames may still arrive (WebRTC: TAIL_S, the frames in
        flight and in the receive jitter buffer)."""
        self.tail_s = tail_s
        self.playing: dict[str, Playing] = {}  # in order of creation
        self.stray_loud_s = 0.0  # loud audio no response owned (should stay 0)

    def event(self, at: float, event: dict[str, Any]) -> list[Received]:
        kind = event.get("type")
        response = event.get("response") or {}
        response_id = str(response.get("id") or "")
        out: list[Received] = [(at, event)]
        if kind == "response.created":
            self.playing[response_id] = Playing(response_id)
        elif kind in ("output_audio_buffer.stopped", "output_audio_buffer.cleared"):
            playing = self.playing.get(event.get("response_id") or "")
            if playing is not None and playing.ended is None:
                playing.ended = at
                if playing.done is not None:
                    out.append(playing.done)
        elif kind == "response.done" and (playing := self.playing.get(response_id)) is not None:
            if (parse_marks(response) or {}).get("first_audio_ms") is None:  # nothing went to the playout
                del self.playing[playing.id]
            elif playing.ended is None:
                playing.done = (at, event)
                return []
        return out

    def frame(self, at: float, seconds: float, loud: bool) -> list[Received]:
        for playing in [p for p in self.playing.values() if p.over(at, self.tail_s)]:
            del self.playing[playing.id]
        if not loud:
            return []
        owner = next(iter(self.playing.values()), None)
        if owner is None:
            self.stray_loud_s += seconds
            return []
        owner.last_loud = at
        return [(at, AudioIn(seconds, owner.id))]


class RealtimeCallClient(SpokenClient):
    """A Realtime session over a WebRTC call, spoken turns; the answer plays at real-time pace, so a turn
    ends when its playout does (output_audio_buffer.stopped), and the next question is not spoken over it."""

    plays_out = True

    def __init__(self, target: Target, http: httpx.AsyncClient, barge_in_after_s: float | None,
                 playback: Playback | None = None) -> None:
        super().__init__(target, Microphone(RTC_RATE, tail_s=0, always_on=True), barge_in_after_s)
        self.http = http
        self.pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))  # host candidates only: no STUN to reach
        self.playback = playback
        self.secret: str | None = None
        self.call_url: str | None = None
        self.frame_gaps_ms: list[float] = []  # between the frames received on the server's track
        self.loud_s = 0.0
        self._last_frame: float | None = None
        self._channel: Any = None  # the oai-events data channel
        self._tasks: list[asyncio.Task[None]] = []

    @classmethod
    async def open(cls, target: Target, http: httpx.AsyncClient, system_prompt: str | None,
                   barge_in_after_s: float | None, timeout_s: float = 30, *, configure: bool = True,
                   playback: Playback | None = None, ice_host: str | None = None) -> RealtimeCallClient:
        """`configure`: False keeps the server's session defaults (only the model is named). `playback`: which
        response a loud frame is heard as, and response.done once heard (a gateway's calls; default: the latest
        response created owns the frames). `ice_host`: the one address to offer (default: loopback for a
        server on loopback, else aioice's own)."""
        if ice_host is not None:
            offer_only(ice_host)
        else:
            offer_loopback_if_local(target.url)
        client = cls(target, http, barge_in_after_s, playback)
        try:
            await client._call(system_prompt, timeout_s, configure)
        except BaseException:
            await client.close()
            raise
        return client

    async def _call(self, system_prompt: str | None, timeout_s: float, configure: bool) -> None:
        url = self.target.url
        channel = self._channel = self.pc.createDataChannel("oai-events")
        opened = asyncio.Event()
        channel.on("open", opened.set)
        channel.on("message", self._on_message)
        channel.on("close", lambda: self._inbox.put_nowait(BenchError("the server closed the call's data channel")))
        self.pc.addTrack(MicrophoneTrack(self.mic))
        self.pc.on("track", self._on_track)
        await self.pc.setLocalDescription(await self.pc.createOffer())  # gathers every candidate first
        session: dict[str, Any] = {"type": "realtime", "model": self.target.model}
        if configure:
            session.update({"output_modalities": ["audio"], "max_output_tokens": self.target.max_tokens,
                            "audio": {"input": {"turn_detection": {"type": "server_vad"}}}})
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
        check_session_created(first[1] if first is not None else None, "call")

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
        for received in self.playback.event(at, event) if self.playback is not None else [(at, event)]:
            self._inbox.put_nowait(received)

    async def send(self, event: dict[str, Any]) -> None:
        self._channel.send(json.dumps(event))

    def _on_track(self, track: MediaStreamTrack) -> None:
        if track.kind == "audio":
            self._tasks.append(asyncio.create_task(self._listen(track)))

    async def _listen(self, track: MediaStreamTrack) -> None:
        while True:
            try:
                frame = await track.recv()
            except MediaStreamError:
                return
            at = time.perf_counter()
            assert isinstance(frame, AudioFrame)  # an audio track's
            if self._last_frame is not None:
                self.frame_gaps_ms.append((at - self._last_frame) * 1000)
            self._last_frame = at
            pcm = frame.to_ndarray().astype(np.float64)  # the decoder's s16, mono upmixed to stereo
            loud = bool(pcm.size) and float(np.sqrt(np.mean(pcm**2))) > LOUD_RMS
            seconds = frame.samples / frame.sample_rate
            self.loud_s += seconds if loud else 0.0
            if self.playback is not None:
                for received in self.playback.frame(at, seconds, loud):
                    self._inbox.put_nowait(received)
            elif loud:
                self._inbox.put_nowait((at, AudioIn(seconds, None)))

    async def link_stats(self) -> dict[str, Any]:
        """What arrived on the server's track, and aiortc's RTP statistics of the call."""
        stats = {entry.type: entry for entry in (await self.pc.getStats()).values()}  # one audio stream each way
        inbound, remote = stats.get("inbound-rtp"), stats.get("remote-inbound-rtp")
        return {
            "frames_received": len(self.frame_gaps_ms) + (self._last_frame is not None),
            "frame_interarrival_ms": describe(self.frame_gaps_ms),
            "loud_audio_s": round(self.loud_s, 2),
            "stray_loud_audio_ms": round(1000 * self.playback.stray_loud_s, 1) if self.playback is not None else None,
            # RFC 3550 interarrival jitter, in units of the Opus RTP clock (48 kHz)
            "rtp_jitter_ms": round(inbound.jitter / 48, 1) if inbound else None,
            "rtp_packets_lost": inbound.packetsLost if inbound else None,
            "rtt_ms": round(remote.roundTripTime * 1000, 1) if remote else None,
        }

    async def close(self) -> None:
        if self.call_url is not None:
            headers = self.target.headers or {"Authorization": f"Bearer {self.secret}"}
            with contextlib.suppress(httpx.HTTPError):
                await self.http.post(f"{self.call_url}/hangup", headers=headers)
        await self.pc.close()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
