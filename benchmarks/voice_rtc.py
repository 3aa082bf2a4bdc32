"""The WebRTC transport of benchmarks.voice: a call made with aiortc the way a browser makes it.

The caller creates the `oai-events` data channel, mints an ephemeral key (`POST
/v1/realtime/client_secrets`), POSTs its SDP offer to `/v1/realtime/calls` (201 and the SDP answer;
`location` names the call for the hang-up) and sends a 48 kHz microphone track. The gateway plays
its replies on its own track, with silence between them: here the server decides what the caller
hears, so a reply is "heard" when its loud frames arrive on that track.
"""

from __future__ import annotations

import asyncio
import contextlib
import fractions
import json
import time
from dataclasses import dataclass
from typing import Any

import httpx
import numpy as np
from aiortc import MediaStreamTrack, RTCConfiguration, RTCPeerConnection, RTCSessionDescription
from aiortc.mediastreams import MediaStreamError
from av import AudioFrame

from benchmarks.voice import MODEL, EventStream, Mic, summary

RATE = 48000  # the microphone track's rate; Opus runs at 48 kHz
LOUD_RMS = 300.0  # int16 RMS of a 20 ms frame that counts as audio (the WebRTC tests use the same)
# After output_audio_buffer.stopped/cleared, frames the gateway had already sent are still on their
# way (aiortc's receive jitter buffer alone holds 4, 80 ms): a response owns the loud frames that
# arrive until this long passed with none.
TAIL_S = 0.5
Timed = tuple[float, dict[str, Any]]  # (perf_counter at arrival, event)


class MicTrack(MediaStreamTrack):
    """The caller's microphone: aiortc's sender pulls 20 ms frames from the wall-clock paced Mic."""

    kind = "audio"

    def __init__(self, mic: Mic) -> None:
        super().__init__()
        self.mic = mic
        self._time_base = fractions.Fraction(1, mic.rate)

    async def recv(self) -> AudioFrame:
        pcm = await self.mic.next_chunk()
        frame = AudioFrame.from_ndarray(pcm.reshape(1, -1), format="s16", layout="mono")
        frame.sample_rate = self.mic.rate
        frame.pts = self.mic.samples
        frame.time_base = self._time_base
        self.mic.handed_over(time.perf_counter())  # returned to aiortc, which encodes and sends it now
        return frame


@dataclass
class Heard:
    """One response's audio as the caller receives it."""

    id: str
    ended: float | None = None  # output_audio_buffer.stopped or .cleared arrived
    last_loud: float | None = None
    done: Timed | None = None  # its response.done, held until its playout ended

    def over(self, now: float) -> bool:
        """The playout ended, and no frame of it has arrived for TAIL_S."""
        return self.ended is not None and now - max(self.ended, self.last_loud or 0.0) >= TAIL_S


class Playback:
    """Which response the caller is hearing: loud frames become `_audio` events of that response.

    The gateway plays one reply at a time, so a loud frame belongs to the oldest response still
    playing: from its response.created until TAIL_S with no loud frame after its
    output_audio_buffer.stopped/cleared (a new reply needs the caller to speak and the VAD to wait
    for silence, so it never starts playing that soon). Its response.done, which the gateway sends
    once everything is generated (often seconds before the caller has heard it all), is handed on,
    with its own arrival time, after the stopped/cleared event: a response is done when its
    playout is.
    """

    def __init__(self) -> None:
        self.playing: dict[str, Heard] = {}  # in order of creation
        self.loud_ms = 0.0
        self.stray_loud_ms = 0.0  # loud audio no response owned (should stay 0)

    def event(self, received: float, event: dict[str, Any]) -> list[Timed]:
        kind = event["type"]
        out: list[Timed] = [(received, event)]
        if kind == "response.created":
            self.playing[event["response"]["id"]] = Heard(event["response"]["id"])
        elif kind in ("output_audio_buffer.stopped", "output_audio_buffer.cleared"):
            heard = self.playing.get(event.get("response_id") or "")
            if heard is not None and heard.ended is None:
                heard.ended = received
                if heard.done is not None:
                    out.append(heard.done)
        elif kind == "response.done" and (heard := self.playing.get(event["response"]["id"])) is not None:
            marks = json.loads((event["response"].get("metadata") or {}).get("gateway_latency") or "{}")
            if marks.get("first_audio_ms") is None:  # nothing went to the playout
                del self.playing[heard.id]
            elif heard.ended is None:
                heard.done = (received, event)
                return []
        return out

    def frame(self, received: float, ms: float, loud: bool) -> list[Timed]:
        for heard in [h for h in self.playing.values() if h.over(received)]:
            del self.playing[heard.id]
        if not loud:
            return []
        self.loud_ms += ms
        owner = next(iter(self.playing.values()), None)
        if owner is None:
            self.stray_loud_ms += ms
            return []
        owner.last_loud = received
        return [(received, {"type": "_audio", "response_id": owner.id, "audio_ms": ms})]


class WebRtcSession(EventStream):
    """A Realtime session over a WebRTC call; events come from the data channel and the received track."""

    def __init__(self, url: str, name: str, wall_offset: float) -> None:
        super().__init__(name, wall_offset)
        self.url = url.rstrip("/")
        self.pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))  # no STUN: nothing to reach here
        self.track = MicTrack(Mic(RATE))
        self.channel: Any = None
        self.playback = Playback()
        self.secret = ""
        self.call_path: str | None = None
        self.frame_gaps_ms: list[float] = []
        self._last_frame: float | None = None

    async def _open(self) -> None:
        self.channel = self.pc.createDataChannel("oai-events")
        opened = asyncio.Event()
        self.channel.on("open", opened.set)
        self.channel.on("message", self._on_message)
        self.channel.on("close", self._on_closed)
        self.pc.addTrack(self.track)  # aiortc pulls it from the moment the call is connected
        self.pc.on("track", self._on_track)
        await self.pc.setLocalDescription(await self.pc.createOffer())  # waits for ICE gathering
        try:
            async with httpx.AsyncClient(base_url=self.url, timeout=30) as http:
                minted = await http.post(
                    "/v1/realtime/client_secrets", json={"session": {"type": "realtime", "model": MODEL}}
                )
                if minted.status_code != 200:
                    raise ConnectionError(f"client_secrets answered {minted.status_code}: {minted.text}")
                self.secret = minted.json()["value"]
                answer = await http.post(
                    "/v1/realtime/calls",
                    content=self.pc.localDescription.sdp,
                    headers={"content-type": "application/sdp", "authorization": f"Bearer {self.secret}"},
                )
        except httpx.HTTPError as exc:
            raise ConnectionError(f"{self.name}: {exc!r}") from exc
        if answer.status_code != 201:
            raise ConnectionError(f"/v1/realtime/calls answered {answer.status_code}: {answer.text}")
        self.call_path = answer.headers["location"]
        await self.pc.setRemoteDescription(RTCSessionDescription(sdp=answer.text, type="answer"))
        await asyncio.wait_for(opened.wait(), 15)

    async def _close(self) -> None:
        """Hang up and close the peer connection (the listener is cancelled and awaited after)."""
        if self.call_path is not None:
            with contextlib.suppress(httpx.HTTPError):
                async with httpx.AsyncClient(base_url=self.url, timeout=5) as http:
                    await http.post(f"{self.call_path}/hangup", headers={"authorization": f"Bearer {self.secret}"})
        await self.pc.close()

    def start_mic(self) -> Mic:
        """The track streams from the moment the call connects (silence until something is said)."""
        self.mic = self.track.mic
        return self.mic

    async def send(self, event: dict[str, Any]) -> None:
        self.channel.send(json.dumps(event))

    def _put(self, timed: list[Timed]) -> None:
        for item in timed:
            self.events.put_nowait(item)

    def _on_message(self, message: str | bytes) -> None:
        self._put(self.playback.event(time.perf_counter(), json.loads(message)))

    def _on_closed(self) -> None:
        self.events.put_nowait((time.perf_counter(), {"type": "_closed"}))

    def _on_track(self, track: MediaStreamTrack) -> None:
        if track.kind == "audio":
            self._tasks.append(asyncio.create_task(self._listen(track), name=f"{self.name} speaker"))

    async def _listen(self, track: MediaStreamTrack) -> None:
        while True:
            try:
                frame = await track.recv()
            except MediaStreamError:
                return
            received = time.perf_counter()
            assert isinstance(frame, AudioFrame)
            if self._last_frame is not None:
                self.frame_gaps_ms.append((received - self._last_frame) * 1000)
            self._last_frame = received
            pcm = frame.to_ndarray().astype(np.float64)  # the decoder's s16, mono upmixed to stereo
            loud = float(np.sqrt(np.mean(pcm**2))) > LOUD_RMS
            self._put(self.playback.frame(received, 1000 * frame.samples / frame.sample_rate, loud))

    async def link_stats(self) -> dict[str, Any]:
        """What arrived on the gateway's track, and aiortc's RTP statistics of the call."""
        stats = {entry.type: entry for entry in (await self.pc.getStats()).values()}  # one audio stream each way
        inbound, remote = stats.get("inbound-rtp"), stats.get("remote-inbound-rtp")
        return {
            "frames_received": len(self.frame_gaps_ms) + (self._last_frame is not None),
            "frame_interarrival_ms": summary(self.frame_gaps_ms),
            "loud_audio_s": round(self.playback.loud_ms / 1000, 2),
            "stray_loud_audio_ms": round(self.playback.stray_loud_ms, 1),
            # RFC 3550 interarrival jitter, in units of the Opus RTP clock (48 kHz)
            "rtp_jitter_ms": round(inbound.jitter / 48, 1) if inbound else None,
            "rtp_packets_lost": inbound.packetsLost if inbound else None,
            "rtt_ms": round(remote.roundTripTime * 1000, 1) if remote else None,
        }
