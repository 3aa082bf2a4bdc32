"""A Starlette WebSocket as a session :class:`~gateway.api.transports.channel.Channel` (the Realtime
WebSocket and the sideband): one JSON event per text frame."""

from __future__ import annotations

import contextlib

from fastapi import WebSocket
from starlette.websockets import WebSocketDisconnect, WebSocketState

from gateway.api.transports.channel import ChannelClosed

NO_CLOSE_FRAME = 1006


class WebSocketChannel:
    def __init__(self, websocket: WebSocket, kind: str = "websocket") -> None:
        self.websocket = websocket
        self.kind = kind

    async def receive(self) -> str | bytes:
        try:
            message = await self.websocket.receive()
        except WebSocketDisconnect as exc:
            raise ChannelClosed(exc.code) from None
        if message["type"] == "websocket.disconnect":
            raise ChannelClosed(int(message.get("code", 1005)))
        text = message.get("text")
        return text if text is not None else message.get("bytes") or b""

    async def send(self, wire: str) -> None:
        try:
            await self.websocket.send_text(wire)
        except (WebSocketDisconnect, OSError):
            raise ChannelClosed(NO_CLOSE_FRAME) from None
        except RuntimeError:
            if WebSocketState.DISCONNECTED in (self.websocket.client_state, self.websocket.application_state):
                raise ChannelClosed(NO_CLOSE_FRAME) from None  # a send that raced the close
            raise

    async def close(self, code: int, reason: str) -> None:
        if self.websocket.application_state == WebSocketState.CONNECTED:
            with contextlib.suppress(Exception):  # the peer may be gone by now
                await self.websocket.close(code, reason)
