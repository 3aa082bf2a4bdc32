"""aiosipua's SIP transports as the trunk needs them: UDP on any event loop, and the stream transports (TCP,
TLS) naming themselves in what they send.

aiosipua's UDP protocol asserts that the datagram transport is asyncio's DatagramTransport, which neither uvloop's
(the gateway's loop) nor CPython 3.11's selector transport is. Its dialogs write `SIP/2.0/UDP` in the Via of every
request and a Contact without a transport, whatever carries them: over TCP or TLS the peer would send its ACK and
BYE over UDP, where no dialog of the call is. The stream transports here fix both in each message on its way out.
"""

from __future__ import annotations

import asyncio
import re
import ssl
from dataclasses import dataclass
from typing import ClassVar

from aiosipua import SipRequest, SipResponse
from aiosipua.transport import TcpSipTransport, UdpSipTransport, _UdpProtocol

_BARE_CONTACT = re.compile(r"^(\s*<sips?:[^>;]+)>")


class _AnyLoopUdpProtocol(_UdpProtocol):
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._owner._udp_transport = transport  # type: ignore[assignment]  # a datagram transport by another class


class AnyLoopUdpTransport(UdpSipTransport):
    """aiosipua's UDP transport; once started, `local_addr` is the address bound (port 0 picks a free one), as
    Via and Contact must name it."""

    async def start(self) -> None:
        transport, _ = await asyncio.get_running_loop().create_datagram_endpoint(
            lambda: _AnyLoopUdpProtocol(self), local_addr=self.local_addr)
        self._udp_transport = transport
        host, port = transport.get_extra_info("sockname")[:2]
        self.local_addr = (str(host), int(port))


@dataclass
class StreamSipTransport(TcpSipTransport):
    """SIP over TCP, each message saying so: its request's top Via and its Contact name this transport."""

    name: ClassVar[str] = "TCP"

    def send(self, message: SipRequest | SipResponse, addr: tuple[str, int]) -> None:
        if isinstance(message, SipRequest):
            vias = message.headers.get("via")
            if vias and vias[0].startswith("SIP/2.0/UDP "):
                message.headers.remove("via")
                for index, via in enumerate(vias):
                    message.headers.append("Via", via.replace("SIP/2.0/UDP", f"SIP/2.0/{self.name}", 1)
                                           if index == 0 else via)
        contact = message.headers.get_first("contact")
        if contact is not None and "transport=" not in contact.lower():
            message.headers.set_single("Contact", _BARE_CONTACT.sub(rf"\1;transport={self.name.lower()}>", contact))
        super().send(message, addr)


@dataclass
class TlsSipTransport(StreamSipTransport):
    """SIP over TLS (RFC 3261 §26.3.1; the callers connect, the gateway presents `context`'s certificate)."""

    name: ClassVar[str] = "TLS"
    context: ssl.SSLContext | None = None

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._handle_connection, host=self.local_addr[0],
                                                  port=self.local_addr[1], ssl=self.context)
