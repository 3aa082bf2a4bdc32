"""One channel interface for a Realtime session's events, and one lifecycle for every transport.

A :class:`Channel` carries JSON events both ways: the WebSocket (`GET /v1/realtime`), a WebRTC call's
`oai-events` data channel, and a sideband WebSocket that watches a call. :func:`run_session` is the
one place that pumps a session's events over a channel, notices how the channel ended, and decides
what becomes of the session (httpcore's `_backends/` keep their I/O behind one small interface the
same way):

- the client closed the channel (a close frame): the session ends;
- the channel dropped (no close frame) and the session may wait for its client: it is parked in the
  :class:`~gateway.realtime.session_hub.SessionHub` for the resume window, and a new channel takes it over
  through :func:`attach` (a resume token over a WebSocket, a new data channel on the same call);
- another channel took the session over: this one is closed (4000) and the session goes on there;
- the session ended (or its client stopped reading): its last events drain, then the channel closes.

A watcher (the sideband) reads a copy of the events and may send its own; its end is only its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Protocol

from gateway.platform.event_log import log_event
from gateway.protocol.errors import ApiError
from gateway.realtime.outbox import OutboxReader, OutboxTap, ReplayUnavailable, SlowConsumer
from gateway.realtime.session_hub import Attachment, SessionHub

if TYPE_CHECKING:
    from gateway.realtime.session import RealtimeSession

log = logging.getLogger(__name__)

CLOSE_NORMAL = 1000
CLOSE_GOING_AWAY = 1001
CLOSE_TRY_AGAIN = 1013
CLOSE_SERVER_ERROR = 1011
CLOSE_RESUMED_ELSEWHERE = 4000  # application code: another connection resumed this session
DRAIN_TIMEOUT_S = 2.0
JOIN_TIMEOUT_S = 5.0


class ChannelClosed(Exception):
    """The peer is gone; ``code`` is its close code (1005/1006: it went without a close frame)."""

    def __init__(self, code: int) -> None:
        super().__init__(f"channel closed ({code})")
        self.code = code

    @property
    def dropped(self) -> bool:
        return self.code not in (CLOSE_NORMAL, CLOSE_GOING_AWAY)


class Channel(Protocol):
    """A transport's side of a session: one event (a JSON text message) at a time."""

    kind: str  # "websocket", "datachannel", "sideband": for the logs

    async def receive(self) -> str | bytes:
        """The next message; raises ChannelClosed when the peer is gone."""
        ...

    async def send(self, wire: str) -> None:
        """Send one event; raises ChannelClosed when the peer is gone."""
        ...

    async def close(self, code: int, reason: str) -> None:
        """Close from this side (a no-op when already closed)."""
        ...


class Outcome(enum.Enum):
    ENDED = "ended"            # the session is over (the caller's ``end`` ran)
    PARKED = "parked"          # the session waits in the hub for its client
    SUPERSEDED = "superseded"  # another channel took the session over
    LEFT = "left"              # a watcher's channel ended; the session goes on


def attach(session: RealtimeSession, last_sequence: int | None) -> OutboxReader:
    """A reader of the session's events after ``last_sequence`` (all live ones when None); the
    previous reader, if any, is superseded. Raises ApiError ``resume_gap`` when those events are
    no longer kept."""
    try:
        return session.outbox.attach(last_sequence)
    except ReplayUnavailable as exc:
        raise ApiError("resume_gap", str(exc), "last_sequence") from None


async def run_session(channel: Channel, session: RealtimeSession, events: OutboxReader | OutboxTap, *,
                      attachment: Attachment | None, hub: SessionHub | None,
                      end: Callable[[], Awaitable[None]] | None,
                      receive: Callable[[str | bytes], Awaitable[None]] | None = None) -> Outcome:
    """Carry ``session``'s events over ``channel`` until one of them ends (see the module docstring).

    ``attachment``: this channel's hold on the session in the hub (None for a watcher). ``end``: what
    ends the session when this channel's client is done with it (None for a watcher). ``receive``: what
    handles a client's message (the session's Realtime decoder unless said: GPT-Live's front). Cancelling this
    (the server shutting down) stops both pumps; the server ends the session itself."""
    writer = asyncio.create_task(_pump_out(channel, session, events), name=f"{channel.kind} writer {session.id}")
    receiver = asyncio.create_task(_pump_in(channel, session, receive), name=f"{channel.kind} reader {session.id}")
    superseded = (asyncio.create_task(attachment.superseded.wait(), name=f"{channel.kind} superseded {session.id}")
                  if attachment is not None else None)
    try:
        await asyncio.wait({t for t in (writer, receiver, superseded) if t is not None},
                           return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        for task in (writer, receiver):
            task.cancel()
        await asyncio.gather(writer, receiver, return_exceptions=True)
        raise
    finally:
        if superseded is not None:
            superseded.cancel()
            await asyncio.gather(superseded, return_exceptions=True)
    taken_over = attachment is not None and attachment.superseded.is_set()
    if not receiver.done():
        # The writer stopped (the peer is gone, or the session is over) or another channel took the
        # session: closing the channel ends the reader between two events, never inside one.
        if taken_over:
            await channel.close(CLOSE_RESUMED_ELSEWHERE, "the session was resumed on another connection")
        else:
            await channel.close(*_close_frame(session, events))
        await _join(receiver)
    if taken_over:
        await _stop(writer)
        return Outcome.SUPERSEDED
    if attachment is None or end is None:  # a watcher
        await _stop(writer)
        await channel.close(*_close_frame(session, events))
        return Outcome.LEFT
    if _dropped(receiver, writer) and hub is not None and hub.park(session, attachment):
        await _stop(writer)
        log_event("realtime.session.parked", session_id=session.id, transport=channel.kind, window_s=hub.window_s)
        return Outcome.PARKED
    if receiver.done() and not receiver.cancelled() and (error := receiver.exception()) is not None:
        if isinstance(error, SlowConsumer):
            log.warning("closing session %s: %s", session.id, error)
        else:
            log.error("session %s: reading its events failed", session.id, exc_info=error)
    await end()
    await _drain(writer)
    await channel.close(*_close_frame(session, events))
    return Outcome.ENDED


def _close_frame(session: RealtimeSession, events: OutboxReader | OutboxTap) -> tuple[int, str]:
    """How the channel closes: the session's own close frame, 1013 for a client that stopped reading,
    and a plain close for a watcher (the session is not its to explain)."""
    if isinstance(events, OutboxTap):
        return (CLOSE_TRY_AGAIN, "slow consumer: events were not read") if events.overflowed else (CLOSE_NORMAL, "")
    if session.outbox.overflowed:
        return CLOSE_TRY_AGAIN, "slow consumer: events were not read"
    return session.close_frame


async def _pump_in(channel: Channel, session: RealtimeSession,
                   receive: Callable[[str | bytes], Awaitable[None]] | None) -> int:
    """The client's events to the session, one at a time and in order, until the client goes;
    returns its close code."""
    while True:
        try:
            message = await channel.receive()
        except ChannelClosed as closed:
            return closed.code
        if isinstance(message, bytes):
            # The Realtime and Live APIs' events are JSON text messages; a binary one is not.
            session.send_error(ApiError("invalid_event", "Events are JSON text messages; a binary one was sent."))
            continue
        await (receive or session.receive)(message)


async def _pump_out(channel: Channel, session: RealtimeSession, events: OutboxReader | OutboxTap) -> bool:
    """The session's events to the client until its outbox closes or another channel takes over.
    Returns True when the peer was found gone. A send that fails for another reason closes the
    outbox (and so the session) with the channel: a session is never left open and mute."""
    try:
        while (wire := await events.next()) is not None:
            await channel.send(wire)
    except ChannelClosed:
        return True
    except Exception:
        log.exception("session %s: sending its events failed (%s)", session.id, channel.kind)
        session.outbox.close()
        await channel.close(CLOSE_SERVER_ERROR, "server error")
        return False
    code, reason = _close_frame(session, events)
    if code != CLOSE_NORMAL and not (isinstance(events, OutboxReader) and events.superseded):
        await channel.close(code, reason)
    return False


def _dropped(receiver: asyncio.Task[int], writer: asyncio.Task[bool]) -> bool:
    """Whether the channel went away without the client closing it, as the reader or the writer
    found out first."""
    if receiver.done() and not receiver.cancelled() and receiver.exception() is None:
        return ChannelClosed(receiver.result()).dropped
    return writer.done() and not writer.cancelled() and writer.exception() is None and writer.result()


async def _stop(task: asyncio.Task[bool]) -> None:
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


async def _join(receiver: asyncio.Task[int]) -> None:
    """Waits for the reader to see the close; a peer that never answers it is cut off."""
    await asyncio.wait({receiver}, timeout=JOIN_TIMEOUT_S)
    if not receiver.done():
        receiver.cancel()
    await asyncio.gather(receiver, return_exceptions=True)


async def _drain(writer: asyncio.Task[bool]) -> None:
    """Let queued events (the final `response.done`, errors) go out, then stop the writer."""
    done, _ = await asyncio.wait({writer}, timeout=DRAIN_TIMEOUT_S)
    if not done:
        writer.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await writer
