"""SDES (RFC 4568) key choice, and a call's SRTP over real sockets on loopback: the caller's side is libsrtp used
directly, as the RFC's peer would."""

from __future__ import annotations

import asyncio
import base64
import os
import socket
import struct

from aiosipua import parse_sdp
from pylibsrtp import Policy, Session

from gateway.api.transports.sip_media import SecureRtp
from gateway.api.transports.sip_trunk import SipTrunk
from gateway.protocol import sdes
from tests.integration.sip_peers import free_port

KEY = base64.b64encode(bytes(range(30))).decode()


def test_the_first_line_it_can_take_is_chosen_with_a_fresh_key_of_ours() -> None:
    keys = sdes.choose([f"1 AEAD_AES_256_GCM inline:{KEY}", f"2 AES_CM_128_HMAC_SHA1_32 inline:{KEY}|2^31",
                        f"3 AES_CM_128_HMAC_SHA1_80 inline:{KEY}"])
    assert keys is not None and (keys.tag, keys.suite, keys.profile) == ("2", "AES_CM_128_HMAC_SHA1_32",
                                                                         "SRTP_PROFILE_AES128_CM_SHA1_32")
    assert keys.remote_key == bytes(range(30)) and len(keys.local_key) == 30 and keys.local_key != keys.remote_key
    tag, suite, inline = keys.answer_line().split(" ")
    assert (tag, suite) == ("2", "AES_CM_128_HMAC_SHA1_32") and base64.b64decode(inline.removeprefix("inline:")) == keys.local_key
    assert sdes.choose([f"1 AES_CM_128_HMAC_SHA1_80 inline:{KEY}"]).local_key != keys.local_key  # type: ignore[union-attr]


def test_lines_it_cannot_honour_are_passed_over() -> None:
    short = base64.b64encode(bytes(16)).decode()
    assert sdes.choose([
        f"1 AES_CM_128_HMAC_SHA1_80 inline:{KEY}|2^20|1:4",  # an MKI
        f"2 AES_CM_128_HMAC_SHA1_80 inline:{KEY} UNENCRYPTED_SRTP",  # a session parameter
        f"3 AES_CM_128_HMAC_SHA1_80 inline:{short}",  # not 30 bytes
        "4 AES_CM_128_HMAC_SHA1_80 inline:***",  # not base64
        "garbage",
    ]) is None
    assert sdes.choose([]) is None


def test_an_offer_is_answered_with_srtp_only_as_rtp_savp_with_keys() -> None:
    def offer(profile: str, crypto: str = "") -> str:
        return ("v=0\r\no=- 1 1 IN IP4 127.0.0.1\r\ns=-\r\nc=IN IP4 127.0.0.1\r\nt=0 0\r\n"
                f"m=audio 40000 {profile} 0 101\r\na=rtpmap:0 PCMU/8000\r\na=rtpmap:101 telephone-event/8000\r\n"
                + (f"a=crypto:{crypto}\r\n" if crypto else ""))

    plain = SipTrunk._negotiate(parse_sdp(offer("RTP/AVP", f"1 AES_CM_128_HMAC_SHA1_80 inline:{KEY}")))
    assert plain == (0, 101, None)  # keys offered on plain RTP/AVP are not SRTP (RFC 4568 §3.1)
    secure = SipTrunk._negotiate(parse_sdp(offer("RTP/SAVP", f"1 AES_CM_128_HMAC_SHA1_80 inline:{KEY}")))
    assert secure is not None and secure[2] is not None and secure[2].remote_key == bytes(range(30))
    assert SipTrunk._negotiate(parse_sdp(offer("RTP/SAVP"))) is None  # SRTP without keys
    assert SipTrunk._negotiate(parse_sdp(offer("UDP/TLS/RTP/SAVP"))) is None  # DTLS-SRTP
    assert SipTrunk._negotiate(parse_sdp(offer("RTP/SAVPF", f"1 AES_CM_128_HMAC_SHA1_80 inline:{KEY}"))) is None


def rtp_packet(sequence: int) -> bytes:
    return struct.pack("!BBHII", 0x80, 0, sequence, sequence * 160, 0x4321) + b"\xff" * 160


async def test_srtp_both_ways_and_plain_or_forged_packets_are_refused() -> None:
    caller_key = os.urandom(30)
    keys = sdes.choose([f"1 AES_CM_128_HMAC_SHA1_80 inline:{base64.b64encode(caller_key).decode()}"])
    assert keys is not None
    profile = Policy.SRTP_PROFILE_AES128_CM_SHA1_80
    caller_out = Session(Policy(key=caller_key, ssrc_type=Policy.SSRC_ANY_OUTBOUND, srtp_profile=profile))
    forger = Session(Policy(key=caller_key, ssrc_type=Policy.SSRC_ANY_OUTBOUND, srtp_profile=profile))
    caller_in = Session(Policy(key=keys.local_key, ssrc_type=Policy.SSRC_ANY_INBOUND, srtp_profile=profile))
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as caller:
        caller.bind(("127.0.0.1", 0))
        caller.setblocking(False)
        port = free_port(even=True)
        rtp = await SecureRtp.create(local_addr=("127.0.0.1", port), remote_addr=caller.getsockname(),
                                     payload_type=0, jitter_prefetch=1)
        assert isinstance(rtp, SecureRtp)
        rtp.secure(keys)
        rtp.expected_host = "127.0.0.1"
        heard: list[int] = []
        rtp.on_audio = lambda pcm, timestamp: heard.append(timestamp)
        try:
            for sequence in range(5):
                caller.sendto(caller_out.protect(rtp_packet(sequence)), ("127.0.0.1", port))
                caller.sendto(rtp_packet(100 + sequence), ("127.0.0.1", port))  # in the clear: refused
                forged = bytearray(forger.protect(rtp_packet(200 + sequence)))
                forged[20] ^= 0xFF  # one payload byte changed: its authentication tag no longer holds
                caller.sendto(bytes(forged), ("127.0.0.1", port))
                await asyncio.sleep(0.02)
            rtp.send_audio_pcm(b"\x00\x00" * 160, 0)
            await asyncio.sleep(0.1)
            received = caller.recv(2048)
        finally:
            await rtp.close()
    assert rtp.unauthenticated == 10
    assert heard and all(timestamp < 100 * 160 for timestamp in heard)  # only the protected packets
    clear = caller_in.unprotect(received)  # what the gateway sent decrypts with the key it answered
    assert clear[1] & 0x7F == 0 and len(clear) == 12 + 160
