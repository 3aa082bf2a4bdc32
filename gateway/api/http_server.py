"""The HTTP server's own guards, below the ASGI app: a deadline and a size bound on every request head.

uvicorn closes a keep-alive connection that stays silent for `timeout_keep_alive`, but any byte
restarts that clock, and a connection that has not sent a whole request head has no deadline at all:
one that sends a header byte by byte, or nothing, stays open for good (half-open connections pile
up). httptools bounds a head's size no more than its time. This protocol adds both, for each request
head from the moment the connection is ready for it: over the time, the connection is closed; over
the size, it is answered 431 and closed.
"""

from __future__ import annotations

import asyncio
import json

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from gateway.protocol.errors import ApiError

MAX_HEAD_BYTES = 64 * 1024  # request line and headers; browsers and proxies stay far below


class GuardedHttpToolsProtocol(HttpToolsProtocol):
    head_timeout_s = 10.0  # set per server by `guarded_protocol`

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self._head_deadline: asyncio.TimerHandle | None = None
        self._head_bytes = 0
        super().connection_made(transport)
        self._start_head()

    def data_received(self, data: bytes) -> None:
        # Bytes read while a head is incomplete; a read that also holds a previous request's body may
        # go uncounted, so the bound holds within one read.
        if self._head_deadline is not None:
            self._head_bytes += len(data)
        super().data_received(data)
        if self._head_deadline is not None and self._head_bytes > MAX_HEAD_BYTES and not self.transport.is_closing():
            self._end_head()
            self._refuse_head()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._start_head()

    def on_headers_complete(self) -> None:
        self._end_head()
        super().on_headers_complete()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing() and (self.cycle is None or self.cycle.response_complete):
            self._start_head()  # idle until the next request: its head is on the clock from now

    def connection_lost(self, exc: Exception | None) -> None:
        self._end_head()
        super().connection_lost(exc)

    def _start_head(self) -> None:
        if self._head_deadline is None:
            self._head_bytes = 0
            self._head_deadline = self.loop.call_later(self.head_timeout_s, self._head_timed_out)

    def _end_head(self) -> None:
        if self._head_deadline is not None:
            self._head_deadline.cancel()
            self._head_deadline = None

    def _head_timed_out(self) -> None:
        self._head_deadline = None
        if not self.transport.is_closing():
            self.transport.close()

    def _refuse_head(self) -> None:
        error = ApiError("request_header_too_large", f"The request line and headers exceed {MAX_HEAD_BYTES} bytes.")
        body = json.dumps({"error": error.body()}).encode()
        head = (
            "HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
        )
        self.transport.write(head.encode() + body)
        self.transport.close()


def guarded_protocol(head_timeout_s: float) -> type[GuardedHttpToolsProtocol]:
    """The protocol class for uvicorn's `http=`, with this server's head timeout."""
    return type("GuardedHttpToolsProtocol", (GuardedHttpToolsProtocol,), {"head_timeout_s": head_timeout_s})
