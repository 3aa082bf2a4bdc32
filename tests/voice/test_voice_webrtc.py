"""Two aiortc peers in one process, over loopback: the inbound reader feeds Whisper, the outbound track plays a PlayoutBuffer."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest
from aiortc import MediaStreamTrack, RTCConfiguration, RTCPeerConnection
from av import AudioFrame

from inference.asr import AsrEngine
from inference.tts import TtsEngine
from media.frames import AudioChunk
from media.playout import PlayoutBuffer
from media.resample import resample
from media.tracks import InboundAudioReader, OutboundAudioTrack
from tests.conftest import QUESTION
from tests.integration.speech import HEARD_AS_SAID, heard_as
from tests.peers import PacedClipTrack

RATE = 48000
FRAME = 960


@pytest.fixture
def loopback_ice(monkeypatch: pytest.MonkeyPatch) -> None:
    # aioice never offers 127.0.0.1 by itself; keep the test on loopback whatever cards the host has.
    monkeypatch.setattr("aioice.ice.get_host_addresses", lambda use_ipv4, use_ipv6: ["127.0.0.1"])


async def wait_for(predicate, timeout: float, step: float = 0.02) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError
        await asyncio.sleep(step)


def rms(frame: AudioFrame) -> float:
    return float(np.sqrt(np.mean(frame.to_ndarray().astype(np.float64) ** 2)))


async def test_two_peers_speech_in_and_playout_out(
    loopback_ice: None, asr: AsrEngine, tts: TtsEngine, question_pcm: np.ndarray
) -> None:
    speech48k = resample(question_pcm, tts.sample_rate, RATE)
    lead = np.zeros(RATE * 3 // 10, dtype=np.int16)
    caller = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    gateway = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    caller.addTrack(PacedClipTrack(np.concatenate([lead, speech48k])))

    # Gateway side: read the caller's audio, play a PlayoutBuffer back.
    chunks: list[AudioChunk] = []
    readers: list[InboundAudioReader] = []
    buffer = PlayoutBuffer(RATE, FRAME)
    events: list[tuple[str, str | None]] = []
    outbound = OutboundAudioTrack(buffer, on_event=lambda kind, item: events.append((kind, item)))

    @gateway.on("track")
    def on_gateway_track(track: MediaStreamTrack) -> None:
        readers.append(InboundAudioReader(track, chunks.append).start())
        gateway.addTrack(outbound)

    # Caller side: record what the gateway sends.
    heard: list[float] = []
    heard_tasks: list[asyncio.Task[None]] = []

    async def listen(track: MediaStreamTrack) -> None:
        while True:
            heard.append(rms(await track.recv()))

    caller.on("track", lambda track: heard_tasks.append(asyncio.create_task(listen(track))))

    try:
        started = time.monotonic()
        await caller.setLocalDescription(await caller.createOffer())
        await gateway.setRemoteDescription(caller.localDescription)
        await gateway.setLocalDescription(await gateway.createAnswer())
        await caller.setRemoteDescription(gateway.localDescription)
        await wait_for(lambda: gateway.connectionState == "connected" and caller.connectionState == "connected", 10)
        connect_s = time.monotonic() - started

        await wait_for(lambda: len(heard) >= 10, 5)  # silence flows before any reply
        buffer.write("item_1", speech48k)

        needed_ms = 1000 * (lead.size + speech48k.size) / RATE + 600
        await wait_for(lambda: len(chunks) * 20 >= needed_ms and ("stopped", "item_1") in events, 15)
        await asyncio.sleep(0.3)  # a little silence after the reply reaches the caller

        # Inbound: 20 ms chunks of 16 kHz mono, and Whisper understands them after Opus.
        assert all(c.sample_rate == 16000 and c.samples == 320 for c in chunks)
        audio = np.concatenate([c.pcm for c in chunks])
        transcript = await asr.transcribe(AudioChunk(audio, 16000).to_float32(), final=True)
        assert transcript is not None and heard_as(transcript.text, QUESTION) >= HEARD_AS_SAID, transcript.text

        # Outbound: silence, then the reply, then silence again; the track is still live.
        assert events == [("started", "item_1"), ("stopped", "item_1")]
        loud = [i for i, level in enumerate(heard) if level > 300]
        assert loud, "no audio reached the caller"
        assert loud[0] >= 5 and heard[-5:] == pytest.approx([0.0] * 5, abs=50)
        assert len(loud) * 20 >= 0.4 * 1000 * speech48k.size / RATE  # quiet syllables fall under the bar
        assert outbound.readyState == "live"
        assert buffer.played_ms("item_1") == pytest.approx(1000 * speech48k.size / RATE)
        assert connect_s < 5
    finally:
        for reader in readers:
            await reader.close()
        for task in heard_tasks:
            task.cancel()
        await caller.close()
        await gateway.close()
