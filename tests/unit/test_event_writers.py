"""The event writer's failure paths over both channels (WebSocket and WebRTC data channel), by fault
injection at the socket: a send that fails for a reason other than the peer leaving closes the
connection with 1011 and the session's outbox, so the session cannot stay open and mute (issue 14's
writer that died on a lone surrogate and left the socket answering pings but silent)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import pytest
from starlette.websockets import WebSocketDisconnect, WebSocketState

from gateway.api.transports.channel import CLOSE_SERVER_ERROR, CLOSE_TRY_AGAIN, _pump_out, run_session
from gateway.api.transports.webrtc import Call, DataChannel
from gateway.api.transports.websocket_channel import WebSocketChannel
from gateway.realtime.outbox import Outbox
from gateway.realtime.session_hub import Attachment


@dataclass
class SocketWithFault:
    """A socket whose send number `fail_at` raises `error`; records what was sent and how it closed."""

    fail_at: int
    error: BaseException
    sent: list[str] = field(default_factory=list)
    closed_with: tuple[int, str] | None = None
    client_state: WebSocketState = WebSocketState.CONNECTED
    application_state: WebSocketState = WebSocketState.CONNECTED

    async def send_text(self, data: str) -> None:
        if len(self.sent) + 1 == self.fail_at:
            raise self.error
        self.sent.append(data)

    async def close(self, code: int = 1000, reason: str = "") -> None:
        self.closed_with = (code, reason)
        self.application_state = WebSocketState.DISCONNECTED


@dataclass
class SessionStub:
    id: str = "sess_test"
    outbox: Outbox = field(default_factory=Outbox)
    close_frame: tuple[int, str] = (1000, "")


async def _run_writer(socket: SocketWithFault, events: int, **outbox_args: int) -> SessionStub:
    session = SessionStub(outbox=Outbox(**outbox_args))
    writer = asyncio.create_task(_pump_out(WebSocketChannel(socket), session, session.outbox.attach()))  # type: ignore[arg-type]
    for n in range(events):
        session.outbox.send({"type": "response.output_text.delta", "delta": f"d{n}"})
        await asyncio.sleep(0)
    await asyncio.wait_for(writer, 5)
    return session


async def test_an_unexpected_send_failure_closes_the_connection_with_1011(caplog: pytest.LogCaptureFixture) -> None:
    socket = SocketWithFault(fail_at=3, error=RuntimeError("encoder broke"))
    await _run_writer(socket, events=5)
    assert len(socket.sent) == 2
    assert socket.closed_with == (CLOSE_SERVER_ERROR, "server error")
    assert [r for r in caplog.records if "sending its events failed" in r.getMessage()], "logged once, with its traceback"


async def test_after_the_writer_dies_the_outbox_is_closed() -> None:
    socket = SocketWithFault(fail_at=1, error=ValueError("bad frame"))
    session = await _run_writer(socket, events=1)
    assert socket.closed_with == (CLOSE_SERVER_ERROR, "server error")
    session.outbox.send({"type": "response.done"})  # the session goes on talking until it sees the close
    assert await asyncio.wait_for(session.outbox.attach().next(), 1) is None, "a closed outbox queues nothing more"


@pytest.mark.parametrize("error", [WebSocketDisconnect(1006), ConnectionResetError("reset by peer")])
async def test_a_peer_that_left_is_not_a_server_error(error: BaseException) -> None:
    socket = SocketWithFault(fail_at=2, error=error)
    await _run_writer(socket, events=3)
    assert socket.closed_with is None  # nothing to close: the peer is gone, and nothing is logged as a fault


async def test_a_send_that_raced_the_close_is_not_a_server_error(caplog: pytest.LogCaptureFixture) -> None:
    socket = SocketWithFault(fail_at=2, error=RuntimeError('Cannot call "send" once a close message has been sent.'))
    socket.application_state = WebSocketState.DISCONNECTED
    await _run_writer(socket, events=3)
    assert socket.closed_with is None
    assert not [r for r in caplog.records if "sending its events failed" in r.getMessage()]


async def test_a_client_that_stops_reading_is_closed_with_1013() -> None:
    socket = SocketWithFault(fail_at=0, error=RuntimeError("unused"))
    session = SessionStub(outbox=Outbox(max_pending_bytes=200))
    writer = asyncio.create_task(_pump_out(WebSocketChannel(socket), session, session.outbox.attach()))  # type: ignore[arg-type]
    with pytest.raises(Exception, match="bytes of events unread"):
        for n in range(10):  # queued in one step of the loop: the writer cannot drain in between
            session.outbox.send({"type": "response.output_text.delta", "delta": "x" * 40 + str(n)})
    await asyncio.wait_for(writer, 5)
    assert socket.closed_with == (CLOSE_TRY_AGAIN, "slow consumer: events were not read")


@dataclass
class ChannelWithFault:
    """An open data channel whose send number `fail_at` raises (aiortc's callbacks, its close fires "close")."""

    fail_at: int
    sent: list[str] = field(default_factory=list)
    readyState: str = "open"  # noqa: N815 (aiortc's name)
    handlers: dict[str, list] = field(default_factory=dict)

    def on(self, event: str, handler) -> None:
        self.handlers.setdefault(event, []).append(handler)

    def send(self, data: str) -> None:
        if len(self.sent) + 1 == self.fail_at:
            raise ValueError("data channel broke")
        self.sent.append(data)

    def close(self) -> None:
        self.readyState = "closed"
        for handler in self.handlers.get("close", []):
            handler()


async def test_a_data_channel_send_failure_ends_the_call(caplog: pytest.LogCaptureFixture) -> None:
    session = SessionStub()
    call = Call(id="rtc_test", pc=None, session=session, playout=None)  # type: ignore[arg-type]
    channel = ChannelWithFault(fail_at=2)

    async def end() -> None:
        call.end()

    writer = asyncio.create_task(run_session(DataChannel(channel), session, session.outbox.attach(),  # type: ignore[arg-type]
                                             attachment=Attachment(), hub=None, end=end))
    for n in range(3):
        session.outbox.send({"type": "response.output_text.delta", "delta": f"d{n}"})
        await asyncio.sleep(0)
    await asyncio.wait_for(writer, 5)
    assert len(channel.sent) == 1
    assert call.ended.is_set(), "the call's supervisor closes the session and the peer connection"
    assert [r for r in caplog.records if "sending its events failed" in r.getMessage()]
