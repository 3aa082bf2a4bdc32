"""A SIP call's RTP: aiortp's session, taking packets only from the host the caller's SDP named, and, for an
offer with SDES keys (RTP/SAVP), SRTP by libsrtp (pylibsrtp, as aiortc has it): every packet out protected, every
packet in authenticated and decrypted, the rest dropped and counted."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pylibsrtp
from aiortp import RTPSession
from pylibsrtp import Policy, Session

from gateway.protocol.sdes import SdesKeys


class NegotiatedRtp(RTPSession):
    """aiortp's session, taking RTP only from the host the SDP offer named: a third party's packets are dropped and
    counted, never heard."""

    expected_host = ""
    dropped = 0

    def _handle_rtp(self, data: bytes, addr: tuple[str, int]) -> None:
        if addr[0] != self.expected_host:
            self.dropped += 1
            return
        super()._handle_rtp(data, addr)


class _Protecting:
    """A datagram transport whose every datagram goes out through `protect` (aiortp's RtpTransport writes to it)."""

    def __init__(self, inner: asyncio.DatagramTransport, protect: Callable[[bytes], bytes]) -> None:
        self._inner = inner
        self._protect = protect

    def sendto(self, data: bytes, addr: tuple[str, int] | None = None) -> None:
        try:
            self._inner.sendto(self._protect(data), addr)
        except pylibsrtp.Error:
            pass  # not an RTP packet libsrtp takes: nothing of the call's leaves in the clear

    def close(self) -> None:
        self._inner.close()

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self._inner.get_extra_info(name, default)


class SecureRtp(NegotiatedRtp):
    """SRTP with the keys the SDP exchanged (`secure`, at once after `create`, before the answer goes out)."""

    unauthenticated = 0  # packets from the caller's host that libsrtp refused (a wrong key, a replay, plain RTP)
    _inbound: Session | None = None

    def secure(self, keys: SdesKeys) -> None:
        profile = getattr(Policy, keys.profile)
        self._inbound = Session(Policy(key=keys.remote_key, ssrc_type=Policy.SSRC_ANY_INBOUND, srtp_profile=profile))
        outbound_policy = Policy(key=keys.local_key, ssrc_type=Policy.SSRC_ANY_OUTBOUND, srtp_profile=profile)
        outbound_policy.allow_repeat_tx = True  # aiortp may send a packet twice (its retransmission history)
        outbound = Session(outbound_policy)
        # aiortp has no hook for this: its two transports' sockets are wrapped, so that all it sends is protected.
        for transport, protect in ((self._rtp_transport, outbound.protect), (self._rtcp_transport, outbound.protect_rtcp)):
            assert transport is not None and transport._transport is not None
            transport._transport = _Protecting(transport._transport, protect)  # type: ignore[assignment]

    def _handle_rtp(self, data: bytes, addr: tuple[str, int]) -> None:
        if addr[0] != self.expected_host:
            self.dropped += 1
            return
        if (clear := self._unprotect(data, rtcp=False)) is not None:
            RTPSession._handle_rtp(self, clear, addr)

    def _handle_rtcp(self, data: bytes, addr: tuple[str, int]) -> None:
        if addr[0] == self.expected_host and (clear := self._unprotect(data, rtcp=True)) is not None:
            super()._handle_rtcp(clear, addr)

    def _unprotect(self, data: bytes, *, rtcp: bool) -> bytes | None:
        if self._inbound is None:
            return None
        try:
            return self._inbound.unprotect_rtcp(data) if rtcp else self._inbound.unprotect(data)
        except pylibsrtp.Error:
            self.unauthenticated += 1
            return None
