"""An answered call's RTP is taken only from the host its SDP offer named (real sockets on loopback)."""

from __future__ import annotations

import asyncio
import socket
import struct

from gateway.api.transports.sip_media import NegotiatedRtp
from tests.integration.sip_peers import free_port


def packet(sequence: int) -> bytes:
    return struct.pack("!BBHII", 0x80, 0, sequence, sequence * 160, 0x1234) + b"\xff" * 160


async def test_packets_from_a_host_that_did_not_negotiate_are_dropped_and_counted() -> None:
    port = free_port(even=True)
    rtp = await NegotiatedRtp.create(local_addr=("127.0.0.1", port), remote_addr=("127.0.0.1", 9), payload_type=0,
                                     jitter_prefetch=1)
    assert isinstance(rtp, NegotiatedRtp)
    rtp.expected_host = "127.0.0.1"
    heard: list[int] = []
    rtp.on_audio = lambda pcm, timestamp: heard.append(timestamp)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as stranger, \
            socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as caller:
        stranger.bind(("127.0.0.2", 0))  # another loopback host
        for sequence in range(5):
            stranger.sendto(packet(sequence), ("127.0.0.1", port))
            caller.sendto(packet(100 + sequence), ("127.0.0.1", port))
            await asyncio.sleep(0.02)
    await asyncio.sleep(0.1)
    await rtp.close()
    assert rtp.dropped == 5
    assert heard and all(timestamp >= 100 * 160 for timestamp in heard)  # only the caller's
