"""run_session's lifecycle over an in-memory channel: what becomes of the session when its channel is
closed by the client, drops, is taken over by another channel, or when the session ends; a watcher's
end is only its own. The same code runs the WebSocket, the data channel and the sideband."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from gateway.api.transports.channel import (
    CLOSE_RESUMED_ELSEWHERE,
    ChannelClosed,
    Outcome,
    attach,
    run_session,
)
from gateway.protocol.errors import ApiError
from gateway.realtime.outbox import Outbox
from gateway.realtime.session_hub import SessionHub


class QueueChannel:
    """A channel whose client is the test: ``inbound`` holds what the client sends (a ChannelClosed
    for its close), ``sent`` what the session sent, ``closed_with`` how the server closed it."""

    kind = "test"

    def __init__(self) -> None:
        self.inbound: asyncio.Queue[str | bytes | ChannelClosed] = asyncio.Queue()
        self.sent: list[str] = []
        self.closed_with: tuple[int, str] | None = None
        self.gone = False

    async def receive(self) -> str | bytes:
        message = await self.inbound.get()
        if isinstance(message, ChannelClosed):
            self.inbound.put_nowait(message)
            raise message
        return message

    async def send(self, wire: str) -> None:
        if self.gone:
            raise ChannelClosed(1006)
        self.sent.append(wire)

    async def close(self, code: int, reason: str) -> None:
        if self.closed_with is None:
            self.closed_with = (code, reason)
            self.inbound.put_nowait(ChannelClosed(code))


@dataclass(eq=False)
class SessionStub:
    resume_token: str = "tok"
    id: str = "sess_stub"
    outbox: Outbox = field(default_factory=lambda: Outbox(replay_bytes=1 << 20))
    close_frame: tuple[int, str] = (1000, "")
    received: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    async def receive(self, raw: str) -> None:
        self.received.append(raw)
        self.outbox.send({"type": "echo", "text": raw})

    def send_error(self, error: ApiError) -> None:
        self.errors.append(error.code)


def _setup(window_s: float = 5.0) -> tuple[SessionHub, SessionStub, list[SessionStub]]:
    ended: list[SessionStub] = []

    async def end_session(session: SessionStub) -> None:  # type: ignore[misc]
        hub.remove(session)  # type: ignore[arg-type]
        session.outbox.close()
        ended.append(session)

    hub = SessionHub(window_s, end_session)  # type: ignore[arg-type]
    return hub, SessionStub(), ended


def _run(channel: QueueChannel, session: SessionStub, hub: SessionHub, attachment, ended: list[SessionStub],
         *, last_sequence: int | None = None) -> asyncio.Task[Outcome]:
    async def end() -> None:
        await hub._end_session(session)  # type: ignore[arg-type]

    reader = attach(session, last_sequence)  # type: ignore[arg-type]
    return asyncio.create_task(run_session(channel, session, reader, attachment=attachment, hub=hub,  # type: ignore[arg-type]
                                           end=end))


async def _settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


async def test_events_flow_both_ways_and_a_client_close_ends_the_session() -> None:
    hub, session, ended = _setup()
    channel = QueueChannel()
    task = _run(channel, session, hub, hub.add(session, "key"), ended)  # type: ignore[arg-type]
    channel.inbound.put_nowait('{"type": "a"}')
    channel.inbound.put_nowait(b"\x00")  # a binary message is an error event, not an end
    await _settle()
    assert session.received == ['{"type": "a"}'] and session.errors == ["invalid_event"]
    assert channel.sent and '"echo"' in channel.sent[0]
    channel.inbound.put_nowait(ChannelClosed(1000))
    assert await asyncio.wait_for(task, 5) is Outcome.ENDED
    assert ended == [session] and channel.closed_with == (1000, "")


async def test_a_dropped_channel_parks_the_session_and_another_takes_it_over_with_the_missed_events() -> None:
    hub, session, ended = _setup()
    first = QueueChannel()
    task = _run(first, session, hub, hub.add(session, "key"), ended)  # type: ignore[arg-type]
    session.outbox.send({"type": "one"})
    await _settle()
    seen = len(first.sent)
    first.inbound.put_nowait(ChannelClosed(1006))  # no close frame
    assert await asyncio.wait_for(task, 5) is Outcome.PARKED
    assert not ended and hub.parked == 1
    session.outbox.send({"type": "while away"})
    _, attachment = hub.take(session.resume_token, "key")
    second = QueueChannel()
    resumed = _run(second, session, hub, attachment, ended, last_sequence=seen)
    await _settle()
    assert len(second.sent) == 1 and "while away" in second.sent[0]
    second.inbound.put_nowait(ChannelClosed(1000))
    assert await asyncio.wait_for(resumed, 5) is Outcome.ENDED and ended == [session]


async def test_a_channel_taken_over_is_closed_4000_and_the_session_goes_on() -> None:
    hub, session, ended = _setup()
    first = QueueChannel()
    task = _run(first, session, hub, hub.add(session, "key"), ended)  # type: ignore[arg-type]
    await _settle()
    _, attachment = hub.take(session.resume_token, "key")
    second = QueueChannel()
    owner = _run(second, session, hub, attachment, ended)
    assert await asyncio.wait_for(task, 5) is Outcome.SUPERSEDED
    assert first.closed_with is not None and first.closed_with[0] == CLOSE_RESUMED_ELSEWHERE
    assert not ended
    session.outbox.send({"type": "after"})
    await _settle()
    assert any("after" in wire for wire in second.sent) and not any("after" in wire for wire in first.sent)
    second.inbound.put_nowait(ChannelClosed(1000))
    assert await asyncio.wait_for(owner, 5) is Outcome.ENDED


async def test_a_send_to_a_gone_peer_parks_and_without_resume_ends() -> None:
    hub, session, ended = _setup(window_s=0)  # resume off
    channel = QueueChannel()
    channel.gone = True
    task = _run(channel, session, hub, hub.add(session, "key"), ended)  # type: ignore[arg-type]
    session.outbox.send({"type": "x"})
    assert await asyncio.wait_for(task, 5) is Outcome.ENDED and ended == [session]


async def test_the_session_ending_drains_its_last_events_and_closes_with_its_frame() -> None:
    hub, session, ended = _setup()
    channel = QueueChannel()
    task = _run(channel, session, hub, hub.add(session, "key"), ended)  # type: ignore[arg-type]
    session.close_frame = (1012, "handed off")
    session.outbox.send({"type": "last"})
    session.outbox.close()
    assert await asyncio.wait_for(task, 5) is Outcome.ENDED
    assert "last" in channel.sent[-1] and channel.closed_with == (1012, "handed off")


async def test_a_watcher_leaves_without_ending_the_session() -> None:
    hub, session, ended = _setup()
    watcher = QueueChannel()
    tap = session.outbox.tap()
    task = asyncio.create_task(run_session(watcher, session, tap, attachment=None, hub=None, end=None))  # type: ignore[arg-type]
    session.outbox.send({"type": "seen by the watcher"})
    watcher.inbound.put_nowait('{"type": "from the watcher"}')
    await _settle()
    assert any("seen by the watcher" in wire for wire in watcher.sent)
    assert session.received == ['{"type": "from the watcher"}']
    watcher.inbound.put_nowait(ChannelClosed(1006))
    assert await asyncio.wait_for(task, 5) is Outcome.LEFT
    assert not ended and not session.outbox.closed and hub.parked == 0
