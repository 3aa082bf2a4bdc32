"""SIP over UDP with aiosipua on any event loop: its protocol asserts that the datagram transport is asyncio's
DatagramTransport, which neither uvloop's (the gateway's loop) nor CPython 3.11's selector transport is."""

from __future__ import annotations

import asyncio

from aiosipua.transport import UdpSipTransport, _UdpProtocol


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
