"""A browser's side of a WebRTC session, for the tests of Realtime calls and GPT-Live sessions alike: an aiortc peer
with a microphone track, the `oai-events` data channel (every event checked against the SDK's types as it
arrives), and the audio it hears, at 48 kHz mono."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar, Self

import numpy as np
import pytest
from aiortc import MediaStreamTrack, RTCConfiguration, RTCPeerConnection
from aiortc.mediastreams import MediaStreamError

from media.resample import resample

RATE = 48000


@pytest.fixture(autouse=True)
def loopback_ice(monkeypatch: pytest.MonkeyPatch) -> None:
    # aioice never offers 127.0.0.1 by itself (the gateway has --ice-host-addresses for this).
    monkeypatch.setattr("aioice.ice.get_host_addresses", lambda use_ipv4, use_ipv6: ["127.0.0.1"])


@dataclass
class BrowserPeer:
    pc: RTCPeerConnection
    channel: Any
    events: list[dict[str, Any]] = field(default_factory=list)  # each with "_at": time.monotonic() when it came
    received: list[tuple[float, np.ndarray]] = field(default_factory=list)  # (arrival time, 48 kHz mono)
    invalid: list[str] = field(default_factory=list)  # events that break the openai SDK's types
    closed: asyncio.Event = field(default_factory=asyncio.Event)  # the data channel closed
    opened: asyncio.Event = field(default_factory=asyncio.Event)  # the data channel opened
    contract: ClassVar[Callable[[dict[str, Any]], None]]  # the protocol's check of one server event

    @classmethod
    def open(cls, microphone: MediaStreamTrack) -> Self:
        """A peer connection with `microphone` and the events channel, listening to what it is sent; the offer is
        the caller's to make."""
        pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
        peer = cls(pc, pc.createDataChannel("oai-events"))
        peer.channel.on("message", peer.receive)
        peer.channel.on("open", peer.opened.set)
        peer.channel.on("close", peer.closed.set)
        pc.addTrack(microphone)

        @pc.on("track")
        def on_track(track: MediaStreamTrack) -> None:
            async def listen() -> None:
                try:
                    while True:
                        frame = await track.recv()
                        pcm = frame.to_ndarray().reshape(-1, len(frame.layout.channels))[:, 0].astype(np.int16)
                        peer.received.append((time.monotonic(), resample(pcm, frame.sample_rate, RATE)))
                except MediaStreamError:
                    return

            asyncio.ensure_future(listen())

        return peer

    def of_type(self, kind: str) -> list[dict[str, Any]]:
        return [event for event in self.events if event["type"] == kind]

    async def wait_for(self, kind: str, count: int = 1, timeout: float = 60.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while len(self.of_type(kind)) < count:
            assert not self.invalid, self.invalid[0]
            if time.monotonic() > deadline:
                raise TimeoutError(f"no {kind} in {timeout} s; got {[e['type'] for e in self.events][-30:]}")
            await asyncio.sleep(0.02)
        assert not self.invalid, self.invalid[0]
        return self.of_type(kind)[count - 1]

    def send(self, event: dict[str, Any]) -> None:
        self.channel.send(json.dumps(event))

    def receive(self, message: str) -> None:
        event = json.loads(message)
        try:
            type(self).contract(event)
        except AssertionError as exc:
            self.invalid.append(str(exc))
        self.events.append({**event, "_at": time.monotonic()})

    def audio_between(self, start: float, end: float) -> np.ndarray:
        frames = [pcm for at, pcm in self.received if start <= at <= end]
        return np.concatenate(frames) if frames else np.zeros(0, np.int16)


def loud(pcm: np.ndarray) -> bool:
    """Whether the audio holds more than silence or comfort noise (RMS above 300 of int16)."""
    return pcm.size > 0 and float(np.sqrt(np.mean(pcm.astype(np.float64) ** 2))) > 300
