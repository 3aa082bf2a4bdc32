"""The aiortc tracks without a network: pacing, transitions, never raising, draining and closing."""

import asyncio
import time

import numpy as np
import pytest
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack
from av import AudioFrame

from media.playout import PlayoutBuffer
from media.tracks import InboundAudioReader, OutboundAudioTrack


async def test_outbound_paces_20ms_frames_and_reports_transitions() -> None:
    buffer = PlayoutBuffer(48000, 960)
    events: list[tuple[str, str | None]] = []
    track = OutboundAudioTrack(buffer, on_event=lambda kind, item: events.append((kind, item)))
    buffer.write("a", np.full(960 * 3, 500, dtype=np.int16))
    t0 = time.monotonic()
    frames = [await track.recv() for _ in range(10)]
    elapsed = time.monotonic() - t0
    await asyncio.sleep(0)  # callbacks run on the loop, after the frame
    assert 0.15 <= elapsed < 0.4  # 9 waits of 20 ms after the first frame
    assert [f.pts for f in frames] == [i * 960 for i in range(10)]
    assert all(f.samples == 960 and f.sample_rate == 48000 and f.format.name == "s16" for f in frames)
    assert [bool(f.to_ndarray().any()) for f in frames] == [True] * 3 + [False] * 7
    assert events == [("started", "a"), ("stopped", "a")]


async def test_outbound_never_raises() -> None:
    class Broken(PlayoutBuffer):
        def read_frame(self):
            raise RuntimeError("bug")

    track = OutboundAudioTrack(Broken(48000, 960))
    frame = await track.recv()
    assert frame.samples == 960 and not frame.to_ndarray().any()
    track.stop()  # even when stopped it keeps the sender fed rather than raising
    assert (await track.recv()).samples == 960


def test_outbound_needs_20ms_frames() -> None:
    with pytest.raises(ValueError):
        OutboundAudioTrack(PlayoutBuffer(48000, 480))


class FakeRemoteTrack(MediaStreamTrack):
    """Decoded Opus as aiortc delivers it: 48 kHz stereo s16, 960 samples, then the end."""

    kind = "audio"

    def __init__(self, frames: int) -> None:
        super().__init__()
        self.left = frames

    async def recv(self) -> AudioFrame:
        if self.left == 0:
            raise MediaStreamError
        self.left -= 1
        t = np.arange(960) / 48000
        tone = (np.sin(2 * np.pi * 440 * t) * 8000).astype(np.int16)
        frame = AudioFrame.from_ndarray(np.repeat(tone, 2).reshape(1, -1), format="s16", layout="stereo")
        frame.sample_rate = 48000
        return frame


async def test_inbound_reader_resamples_to_20ms_16k_chunks_and_ends_on_stream_end() -> None:
    chunks = []
    ended = asyncio.Event()

    async def on_chunk(chunk) -> None:
        chunks.append(chunk)

    reader = InboundAudioReader(FakeRemoteTrack(50), on_chunk, on_end=ended.set).start()
    await asyncio.wait_for(ended.wait(), 2)
    assert all(c.sample_rate == 16000 and c.samples == 320 for c in chunks)
    # 1 s in; the resampler holds back a few ms until more audio comes.
    assert 48 <= len(chunks) <= 50
    assert reader.frames_received == 50
    await reader.close()


async def test_inbound_reader_close_cancels_a_waiting_reader_and_survives_callback_errors() -> None:
    class Endless(MediaStreamTrack):
        kind = "audio"

        async def recv(self) -> AudioFrame:
            await asyncio.sleep(3600)
            raise AssertionError

    reader = InboundAudioReader(Endless(), lambda chunk: None).start()
    await asyncio.sleep(0.01)
    await asyncio.wait_for(reader.close(), 1)

    def broken(chunk) -> None:
        raise ValueError("consumer bug")

    ended = asyncio.Event()
    reader = InboundAudioReader(FakeRemoteTrack(5), broken, on_end=ended.set).start()
    await asyncio.wait_for(ended.wait(), 2)
    assert reader.frames_received == 5
    await reader.close()


async def test_incoming_audio_waits_for_one_later_packet_not_four() -> None:
    from aiortc import RTCPeerConnection
    from aiortc.rtp import RtpPacket

    from media.tracks import shorten_audio_reorder_wait

    caller, gateway = RTCPeerConnection(), RTCPeerConnection()
    try:
        caller.addTrack(OutboundAudioTrack(PlayoutBuffer(48000, 960)))
        await caller.setLocalDescription(await caller.createOffer())
        await gateway.setRemoteDescription(caller.localDescription)
        assert shorten_audio_reorder_wait(gateway, 1)
        (transceiver,) = gateway.getTransceivers()
        buffer = transceiver.receiver._RTCRtpReceiver__jitter_buffer
        # One 20 ms Opus packet after another: each comes out as soon as the next one is in.
        released = []
        for n in range(4):
            packet = RtpPacket(sequence_number=n, timestamp=960 * n)
            packet._data = b"opus"  # the depayloaded frame, as the receiver sets it
            released.append(buffer.add(packet)[1])
        assert released[0] is None and [f.timestamp for f in released[1:]] == [0, 960, 1920]
    finally:
        await caller.close()
        await gateway.close()
