"""One SIP call's media and session: a ringing call as the routes find it (RingingCall), and once answered its RTP,
its pacer and the session it feeds (SipCall). The trunk (sip_trunk.py) owns both and carries out their signalling.

An answered call is a Realtime session (`/v1/realtime/calls/{id}/accept`) or a GPT-Live one
(`/v1/live/sessions/{id}/accept`): the caller's G.711 at 8 kHz goes to the VAD and Whisper at 16 kHz (for Live,
through its front, which a sideband hears), the replies go out as RTP every 20 ms from the session's playout
buffer (an interruption clears it), and keypad digits (RFC 4733) are the surface's events:
`input_audio_buffer.dtmf_event_received` or `transport.dtmf.received`. A Live sideband's `transport.dtmf.send`
goes to the caller as RFC 4733 events on the call's RTP stream.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
from aiosipua import IncomingCall, SdpMessage

from gateway.api.session_registry import SessionRegistry
from gateway.api.transports.sip_call_state import SipCallState
from gateway.api.transports.sip_media import NegotiatedRtp, SecureRtp
from gateway.platform.event_log import log_event
from gateway.protocol.errors import ApiError
from gateway.protocol.sdes import SdesKeys
from gateway.realtime.live_front import LiveFront
from gateway.realtime.session import RealtimeSession
from media.frames import AudioChunk
from media.playout import PlayoutBuffer
from media.resample import Resampler

log = logging.getLogger(__name__)

RATE = 8000  # G.711
FRAME_SAMPLES = RATE // 50  # 20 ms a packet
LISTEN_RATE = 16000  # what the session's VAD and Whisper take
DIGIT_MS = 160  # a keypress sent to the caller lasts this long (RFC 4733's events, a phone's usual press)
# No RTP from the caller this long (a phone's silence suppression, a stream that stopped): the session hears
# silence until packets come again, so the VAD still sees the turn end.
GAP_FILL_S = 0.1
_MAX_LAG_S = 0.2  # the pacer that fell this far behind (a stalled loop) restarts its clock

Surface = Literal["realtime", "live"]


@dataclass(eq=False)
class RingingCall:
    """One INVITE's call from the moment it rings to its end, answered or not: what the routes find by its id on
    each surface (Realtime's `rtc_...`; GPT-Live's session id, for an SRTP call only)."""

    id: str
    invite: IncomingCall
    offer: SdpMessage
    payload_type: int
    dtmf_payload_type: int
    srtp: SdesKeys | None  # the SDES keys of an RTP/SAVP call; None: plain RTP
    live_id: str | None = None  # GPT-Live's id of the pending session (SRTP calls only)
    machine: SipCallState = field(default_factory=SipCallState)
    answered: SipCall | None = None
    timer: asyncio.TimerHandle | None = None
    delivery: asyncio.Task[None] | None = None  # the webhooks, tried again until one arrives or the call is answered

    @property
    def sip_call_id(self) -> str:
        return self.invite.call_id

    def id_on(self, surface: Surface) -> str | None:
        return self.id if surface == "realtime" else self.live_id


@dataclass(eq=False)
class SipCall:
    """An answered call: its session (with its Live front on GPT-Live), its RTP and the pacer. Its signalling is
    the trunk's: `hang_up` sends the BYE (unless the caller's came first), `release_port` frees its RTP ports."""

    id: str
    session: RealtimeSession
    rtp: NegotiatedRtp
    rtp_port: int
    ringing: RingingCall
    hang_up: Callable[[], None]
    release_port: Callable[[], Awaitable[None]]
    front: LiveFront | None = None  # a GPT-Live session's: it hears the caller and follows the playout
    secret_digest: str | None = None  # only an API key hangs a SIP call up
    held: bool = False  # the caller put the call on hold (a re-INVITE): no RTP is sent until it resumes
    ended: asyncio.Event = field(default_factory=asyncio.Event)
    playout: PlayoutBuffer = field(default_factory=lambda: PlayoutBuffer(RATE, FRAME_SAMPLES))
    _inbound: Resampler = field(default_factory=lambda: Resampler(RATE, LISTEN_RATE, quality="LQ"))
    _heard_at: float | None = None  # when the caller's last audio came (monotonic)
    _timestamp: int = 0  # the RTP timestamp of the next packet

    def end(self) -> None:
        """The session ended or `hangup` was called: BYE, unless the caller's came first."""
        self.hang_up()

    def hear(self, pcm: bytes, _timestamp: int) -> None:
        if pcm:
            self._heard_at = time.monotonic()
            self._listen(np.frombuffer(pcm, dtype=np.int16))

    def _fill_gap(self) -> None:
        if self._heard_at is not None and time.monotonic() - self._heard_at > GAP_FILL_S:
            self._listen(np.zeros(FRAME_SAMPLES, dtype=np.int16))

    def _listen(self, audio_8k: np.ndarray) -> None:
        try:
            if self.front is not None:  # GPT-Live: at the call's rate, which a sideband hears; the front resamples
                self.front.hear(AudioChunk(audio_8k, RATE))
                return
            voice = self.session.voice
            audio = self._inbound.process(audio_8k)
            if voice is not None and audio.size:
                voice.append(AudioChunk(audio, LISTEN_RATE))
        except ApiError as error:
            self.session.send_error(error)

    def digit(self, digit: str, _duration: int) -> None:
        try:
            if self.front is not None:
                self.front.dtmf_received(digit)
            else:
                self.session.dtmf_received(digit, received_at=int(time.time()))
        except ApiError as error:
            self.session.send_error(error)

    def send_digit(self, digit: str) -> None:
        """A keypress to the caller (a Live sideband's transport.dtmf.send), as RFC 4733 events at the stream's
        present timestamp."""
        if not self.ringing.dtmf_payload_type:
            raise ApiError("dtmf_unavailable", "The caller's phone offered no telephone-event (RFC 4733): it "
                           "cannot be sent digits.", "event")
        self.rtp.send_dtmf(digit, DIGIT_MS, self._timestamp)
        log_event("sip.call.digit_sent", call_id=self.id)

    def _frame_event(self, kind: str, item_id: str | None) -> None:
        if self.front is not None:
            self.front.playout_event(kind, item_id)
        else:
            self.session.on_playout_event(kind, item_id)

    async def pace(self) -> None:
        """A packet every 20 ms for the whole call (silence between replies), so timestamps run on the RTP clock; and
        silence to the session for each 20 ms the caller sent nothing."""
        loop = asyncio.get_running_loop()
        start, frames = loop.time(), 0
        while True:
            frame = self.playout.read_frame()
            if frame.started:
                self._frame_event("started", frame.item_id)
            if not self.held:
                self.rtp.send_audio_pcm(frame.pcm.tobytes(), self._timestamp)
            if self.front is not None and (frame.audio_samples or frame.stopped):
                self.front.played(frame)  # its words follow the audio sent, and a sideband hears it
            if frame.stopped:
                self._frame_event("stopped", frame.item_id)
            self._fill_gap()
            self._timestamp = (self._timestamp + FRAME_SAMPLES) & 0xFFFFFFFF
            frames += 1
            wait = start + frames * FRAME_SAMPLES / RATE - loop.time()
            if wait < -_MAX_LAG_S:
                start, frames = loop.time(), 0
            await asyncio.sleep(max(0.0, wait))

    async def run(self, sessions: SessionRegistry) -> None:
        """The call until it ends: the pacer and the session's events (dropped: a sideband taps a copy)."""
        reader = self.session.outbox.attach()

        async def drain() -> None:
            while await reader.next() is not None:
                pass

        tasks = [asyncio.create_task(self.pace(), name=f"pace {self.id}"),
                 asyncio.create_task(drain(), name=f"events {self.id}"),
                 asyncio.create_task(self.ended.wait(), name=f"ended {self.id}")]
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                if not task.cancelled() and (failure := task.exception()) is not None:
                    log.error("sip call %s failed", self.id, exc_info=failure)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            if self.front is not None:
                # The call ended from outside (a hangup from our side has said session.closed already).
                reason = "remote_hangup" if self.ringing.machine.end_reason == "caller_hung_up" else "connection_lost"
                self.front.closed_by(reason)
                await self.front.close()
            await self.rtp.close()
            await self.release_port()
            await sessions.end_session(self.session)
            self.hang_up()  # a pacer that failed ends the call too
            log_event("sip.call.ended", call_id=self.id, session_id=self.session.id,
                      reason=self.ringing.machine.end_reason, rtp_dropped=self.rtp.dropped,
                      srtp_unauthenticated=self.rtp.unauthenticated if isinstance(self.rtp, SecureRtp) else None)
