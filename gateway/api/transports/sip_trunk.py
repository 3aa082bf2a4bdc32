"""Phone calls from a SIP trunk, answered the way OpenAI's Realtime and GPT-Live answer them (--sip-listen).

For each INVITE from an allowed source the gateway rings (100 Trying, 180 Ringing) and POSTs `realtime.call.incoming`
to --webhook-url, signed with --webhook-secret; for an SRTP call, which may become a GPT-Live session too, also
`live.transport.incoming`, with that session's id. The application answers on one surface, and the first accept
chooses it: `/v1/realtime/calls/{call_id}/accept` (the session object) or `/v1/live/sessions/{session_id}/accept`
(`{"session": ...}`); `/reject` or, once answered, `/refer` and `/hangup` on the same surface. It watches the call
over `/v1/realtime?call_id=...` or the Live sideband (`/v1/live/sessions/{id}/attach`). The call's media and
session are sip_call.py's.

SIP transactions, dialogs and SDP are aiosipua's, RTP, RTCP and RFC 4733 aiortp's; this module decides (who may
call, which codec, when to give up) and drives them. Who may call: a source in --sip-allow, under its INVITEs per
minute, and with --sip-auth one that answers a digest challenge (gateway/protocol/sip_digest.py).
Media: RTP, or SRTP keyed by SDES (an RTP/SAVP offer with a crypto line; sip_media.py); DTLS-SRTP is refused (488).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections import defaultdict, deque
from ipaddress import ip_address, ip_network
from typing import Any

from aiortp import PortAllocator
from aiosipua import IncomingCall, SdpMessage, SipRequest, SipUAC, SipUAS, negotiate_sdp

from gateway.api.session_registry import SessionRegistry
from gateway.api.transports.sip_call import RingingCall, SipCall, Surface
from gateway.api.transports.sip_call_state import (
    Action,
    Answer,
    CallState,
    Decline,
    Finish,
    SendBye,
    SendRefer,
)
from gateway.api.transports.sip_media import NegotiatedRtp, SecureRtp
from gateway.api.transports.webrtc import CallRegistry
from gateway.platform import metrics
from gateway.platform.config import Settings
from gateway.platform.event_log import log_event
from gateway.platform.webhooks import WebhookSender
from gateway.protocol import sdes
from gateway.protocol.errors import ApiError
from gateway.protocol.sdes import SdesKeys
from gateway.protocol.sip_digest import DigestAuthenticator, DigestVerdict
from gateway.protocol.sip_transports import AnyLoopUdpTransport, StreamSipTransport, TlsSipTransport
from gateway.realtime.conversation import new_id
from gateway.realtime.live_front import LiveFront
from gateway.realtime.session import RealtimeSession

CODECS = {0: "PCMU", 8: "PCMA"}  # the payload types answered, in the caller's order of preference
JITTER_PREFETCH = 2  # packets aiortp holds before the first is played on: 40 ms against reordering
# Headers the webhook never carries (OpenAI: "excluding SIP authorization headers").
PRIVATE_HEADERS = {"authorization", "proxy-authorization"}


class SipTrunk:
    """The SIP listener (UDP and TCP on --sip-listen, TLS on the next port with --sip-tls-cert) and its calls: the
    owner of every ringing call's timer and webhook delivery, and of each answered call's task."""

    def __init__(self, settings: Settings, sessions: SessionRegistry, registry: CallRegistry) -> None:
        assert settings.sip_listen is not None and settings.webhook_url and settings.webhook_secret
        host, _, port = settings.sip_listen.rpartition(":")
        self.listen = (host.strip("[]"), int(port))
        self.advertise_ip = settings.sip_advertise_ip or self.listen[0]
        self.tls_port = self.listen[1] + 1  # 5061 beside 5060
        self.transports = ["udp", "tcp", "tls"] if settings.sip_tls_cert is not None else ["udp", "tcp"]
        self._settings = settings
        self._sessions = sessions
        self._registry = registry  # CallRegistry: answered calls, for the sideband and hangup
        self._allowed = [ip_network(network, strict=False) for network in settings.sip_allow]
        low, high = (int(part) for part in settings.sip_rtp_ports.split("-"))
        self._ports = PortAllocator((low, high))
        self._webhooks = WebhookSender(settings.webhook_url, settings.webhook_secret)
        self._uas: list[SipUAS] = []
        # The calls by their id on each surface, until they end; an accepted call only on the surface that took it.
        self._surfaces: dict[Surface, dict[str, RingingCall]] = {"realtime": {}, "live": {}}
        self._by_sip_id: dict[str, RingingCall] = {}  # every call, by its SIP Call-ID
        self._digest = DigestAuthenticator(settings.sip_passwords(), settings.sip_auth_realm) if settings.sip_auth \
            else None
        self._recent_invites: defaultdict[str, deque[float]] = defaultdict(deque)
        self._deliveries: set[asyncio.Task[None]] = set()

    # -- lifecycle --------------------------------------------------------------------------------

    async def start(self) -> None:
        transports: list[AnyLoopUdpTransport | StreamSipTransport] = [
            AnyLoopUdpTransport(local_addr=self.listen), StreamSipTransport(local_addr=self.listen)]
        if self._settings.sip_tls_cert is not None:
            transports.append(TlsSipTransport(local_addr=(self.listen[0], self.tls_port),
                                              context=self._settings.sip_tls_context()))
        for transport in transports:
            uas = SipUAS(transport, user_agent="gateway", uac=SipUAC(transport),
                         advertised_addr=(self.advertise_ip, transport.local_addr[1]))
            uas.on_invite = self._on_invite
            uas.on_reinvite = self._on_reinvite
            uas.on_cancel = self._on_cancel
            uas.on_bye = self._on_bye
            uas.on_ack_timeout = self._on_ack_timeout
            await uas.start()
            self._uas.append(uas)
        log_event("sip.listening", host=self.listen[0], port=self.listen[1], transports=",".join(self.transports),
                  tls_port=self.tls_port if "tls" in self.transports else None, advertise=self.advertise_ip)

    async def stop(self) -> None:
        for ringing in list(self._by_sip_id.values()):
            self.perform(ringing, ringing.machine.hang_up())
        for task in list(self._deliveries):
            task.cancel()
        await asyncio.gather(*self._deliveries, return_exceptions=True)
        for uas in self._uas:
            await uas.stop()
        await self._webhooks.aclose()

    def status(self) -> dict[str, Any]:
        states = [ringing.machine.state for ringing in self._by_sip_id.values()]
        return {"listen": f"{self.listen[0]}:{self.listen[1]}", "transports": self.transports,
                "tls_listen": f"{self.listen[0]}:{self.tls_port}" if "tls" in self.transports else None,
                "media": ["rtp", "srtp"], "codecs": list(CODECS.values()),
                "auth": "digest" if self._digest is not None else "source address",
                "ringing": states.count(CallState.RINGING), "answered": states.count(CallState.ANSWERED)}

    # -- from the SIP side ------------------------------------------------------------------------

    def _on_invite(self, invite: IncomingCall) -> None:
        if (ringing := self._by_sip_id.get(invite.call_id)) is not None:
            # The INVITE again (UDP retransmits it): aiosipua took it for a new call. The call it is keeps its
            # dialog (so the ACK of our answer matches) and rings again.
            self._uas_of(invite)._calls[invite.call_id] = ringing.invite
            if ringing.machine.state is CallState.RINGING:
                ringing.invite.ringing()
            return
        source = invite.source_addr[0]
        if not self._allowed_source(source):
            self._refuse(invite, 403, "Forbidden")
            return
        if (retry_after := self._rate_limited(source)) is not None:
            self._refuse(invite, 503, "Service Unavailable", {"Retry-After": str(retry_after)})
            return
        if self._digest is not None:
            request = invite.invite
            verdict = self._digest.verify(request.headers.get_first("Authorization"), request.method)
            if verdict is DigestVerdict.WRONG:
                self._refuse(invite, 403, "Forbidden")
                return
            if verdict is not DigestVerdict.GOOD:
                self._refuse(invite, 401, "Unauthorized",
                             {"WWW-Authenticate": self._digest.challenge(stale=verdict is DigestVerdict.STALE)})
                return
        chosen = self._negotiate(invite.sdp_offer)
        if chosen is None:
            self._refuse(invite, 488, "Not Acceptable Here")
            return
        assert invite.sdp_offer is not None
        replica = self._settings.replica_id
        ringing = RingingCall(id=new_id(f"rtc_{replica}"), invite=invite, offer=invite.sdp_offer,
                              payload_type=chosen[0], dtmf_payload_type=chosen[1], srtp=chosen[2],
                              # GPT-Live takes SIP calls on SRTP only; its id names this replica, as every Live one
                              live_id=new_id(f"sess_{replica}") if chosen[2] is not None else None)
        self._surfaces["realtime"][ringing.id] = ringing
        if ringing.live_id is not None:
            self._surfaces["live"][ringing.live_id] = ringing
        self._by_sip_id[ringing.sip_call_id] = ringing
        invite.ringing()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._settings.sip_answer_timeout_s
        ringing.timer = loop.call_at(deadline, lambda: self.perform(ringing, ringing.machine.answer_timeout()))
        task = asyncio.create_task(self._announce(ringing, deadline), name=f"webhook {ringing.id}")
        ringing.delivery = task
        self._deliveries.add(task)
        task.add_done_callback(self._deliveries.discard)
        metrics.SIP_INVITES.labels("ringing").inc()
        log_event("sip.call.ringing", call_id=ringing.id, source=source,
                  transport=self.transports[self._uas.index(self._uas_of(invite))], codec=CODECS[ringing.payload_type],
                  media=ringing.srtp.suite if ringing.srtp is not None else "rtp")

    def _on_reinvite(self, invite: IncomingCall) -> None:
        """A re-INVITE from the caller: a refresh (no offer, or the same one), its media moved to another address
        or port, or a hold (`sendonly`, `inactive`) or its end. What cannot be honoured on the call's RTP session
        (another codec, new SRTP keys, another profile) gets 488, and the call goes on as it was (RFC 3261 §14.2)."""
        ringing = self._by_sip_id.get(invite.call_id)
        call = ringing.answered if ringing is not None else None
        if call is None or ringing is None or not invite.invite.body:
            invite.accept(invite.sdp_answer)  # a session refresh: nothing is offered, the media stays
            return
        offer = invite.sdp_offer
        chosen = self._negotiate(offer)
        if offer is None or chosen is None or chosen[0] != ringing.payload_type \
                or not _same_keys(ringing.srtp, chosen[2]):
            # IncomingCall.reject() would end the dialog too: a refused re-INVITE leaves the call as it was.
            invite._send_response(488, "Not Acceptable Here")
            log_event("sip.call.reinvite_refused", call_id=ringing.id)
            return
        remote = offer.rtp_address
        assert remote is not None and offer.audio is not None  # _negotiate took it
        on_hold_address = remote[0] in ("0.0.0.0", "::")  # RFC 2543's hold: the media stays where it was
        moved = not on_hold_address and remote != ringing.offer.rtp_address
        if moved:
            call.rtp.update_remote(remote)
            call.rtp.expected_host = remote[0]
        # The caller hears nothing on hold: nothing is sent.
        call.held = on_hold_address or offer.audio.direction in ("sendonly", "inactive")
        answer, _ = negotiate_sdp(offer, self.advertise_ip, call.rtp_port, supported_codecs=[ringing.payload_type],
                                  dtmf_payload_type=ringing.dtmf_payload_type)
        if ringing.srtp is not None and answer.audio is not None:
            answer.audio.attributes["crypto"] = [ringing.srtp.answer_line()]
        previous = invite.sdp_answer
        if previous is not None:  # RFC 3264 §8: the same session, a later version of it
            answer.origin.session_id = previous.origin.session_id
            answer.origin.session_version = str(int(previous.origin.session_version or "0") + 1)
        if not on_hold_address:
            ringing.offer = offer
        invite.accept(answer)
        log_event("sip.call.media_changed", call_id=ringing.id, moved=moved, held=call.held)

    def _on_cancel(self, request: SipRequest, _addr: tuple[str, int]) -> None:
        ringing = self._by_sip_id.get(request.call_id or "")
        if ringing is not None:
            self.perform(ringing, ringing.machine.caller_cancel())

    def _on_bye(self, invite: IncomingCall, _request: SipRequest) -> None:
        ringing = self._by_sip_id.get(invite.call_id)
        if ringing is not None:
            self.perform(ringing, ringing.machine.caller_bye())

    def _on_ack_timeout(self, invite: IncomingCall) -> None:
        """Our 200 OK was never acknowledged: the caller is not there to talk to."""
        ringing = self._by_sip_id.get(invite.call_id)
        if ringing is not None:
            self.perform(ringing, ringing.machine.failed("ack_timeout"))

    def _allowed_source(self, host: str) -> bool:
        try:
            address = ip_address(host)
        except ValueError:
            return False
        return any(address in network for network in self._allowed)

    def _rate_limited(self, host: str) -> int | None:
        """None when `host` may ring another call; else the seconds until it may (a 503's Retry-After)."""
        now = time.monotonic()
        recent = self._recent_invites[host]
        while recent and recent[0] < now - 60:
            recent.popleft()
        for other in [other for other, times in self._recent_invites.items() if not times and other != host]:
            del self._recent_invites[other]  # the sources quiet for a minute are forgotten
        if len(recent) >= self._settings.sip_invites_per_minute:
            return max(1, math.ceil(recent[0] + 60 - now))
        recent.append(now)
        return None

    @staticmethod
    def _negotiate(offer: SdpMessage | None) -> tuple[int, int, SdesKeys | None] | None:
        """(audio payload type, telephone-event payload type or 0, the SDES keys of an RTP/SAVP offer), or None
        when nothing offered can be answered: no SDP (a late offer), no audio, no G.711, a secure profile other than
        RTP/SAVP (DTLS-SRTP, AVPF), or RTP/SAVP with no crypto line taken (gateway/protocol/sdes.py)."""
        if offer is None or offer.audio is None or offer.rtp_address is None:
            return None
        media = offer.audio
        keys = None
        if media.proto == "RTP/SAVP":
            if (keys := sdes.choose(media.attributes.get("crypto", []))) is None:
                return None
        elif media.proto != "RTP/AVP":
            return None
        audio = next((codec for codec in media.codecs if codec.payload_type in CODECS), None)
        if audio is None:
            return None
        dtmf = next((codec.payload_type for codec in media.codecs
                     if codec.encoding_name.lower() == "telephone-event"), 0)
        return audio.payload_type, dtmf, keys

    def _refuse(self, invite: IncomingCall, status: int, reason: str, headers: dict[str, str] | None = None) -> None:
        """A final answer before any webhook; the call is forgotten at once (no dialog follows a refusal)."""
        # IncomingCall.reject() is _send_response() without headers: a 401's challenge and a 503's Retry-After need them
        invite._send_response(status, reason, extra_headers=headers)
        invite.dialog.terminate()
        self._uas_of(invite)._calls.pop(invite.call_id, None)
        metrics.SIP_INVITES.labels(str(status)).inc()
        log_event("sip.invite.refused", source=invite.source_addr[0], status=status)

    # -- to the application -----------------------------------------------------------------------

    async def _announce(self, ringing: RingingCall, deadline: float) -> None:
        """The call to the application on each surface it may be answered on, at once; it is turned away only when
        neither event arrived."""
        headers = [{"name": name, "value": value} for name, values in ringing.invite.invite.headers.items()
                   if name.lower() not in PRIVATE_HEADERS for value in values]
        security = "srtp" if ringing.srtp is not None else "rtp"
        events = [WebhookSender.event("realtime.call.incoming", {
            "call_id": ringing.id, "sip_headers": headers, "sip_media_security": security})]
        if ringing.live_id is not None:
            events.append(WebhookSender.event("live.transport.incoming", {
                "type": "sip", "session_id": ringing.live_id, "sip_headers": headers, "sip_media_security": security}))
        delivered = await asyncio.gather(*(self._webhooks.deliver(event, deadline) for event in events))
        if not any(delivered) and ringing.machine.state is CallState.RINGING:
            self.perform(ringing, ringing.machine.failed("webhook_undelivered"))

    def has_call(self, call_id: str, surface: Surface = "realtime") -> bool:
        return call_id in self._surfaces[surface]

    def require_ringing(self, call_id: str, surface: Surface = "realtime") -> None:
        """409 unless the call is still ringing (answered or ended calls are not accepted again)."""
        if (state := self.ringing_call(call_id, surface).machine.state) is not CallState.RINGING:
            raise ApiError("call_not_ringing", f"The call is {state.value}: it can no longer be accepted.", "call_id",
                           status=409)

    def ringing_call(self, call_id: str, surface: Surface = "realtime") -> RingingCall:
        ringing = self._surfaces[surface].get(call_id)
        if ringing is None:
            raise ApiError("call_not_found", f"No SIP call '{call_id}'.", "call_id", status=404)
        return ringing

    async def accept(self, call_id: str, session: RealtimeSession, front: LiveFront | None = None) -> SipCall:
        """Answer the ringing call with `session` (not yet started; with its Live `front` on GPT-Live's surface):
        its RTP bound, 200 OK sent, the call run. The other surface no longer finds the call."""
        surface: Surface = "live" if front is not None else "realtime"
        ringing = self.ringing_call(call_id, surface)
        self.require_ringing(call_id, surface)
        remote = ringing.offer.rtp_address or ("", 0)
        try:
            port, _ = await self._ports.allocate()  # an even port and the next, for RTCP
        except RuntimeError as error:
            self.perform(ringing, ringing.machine.failed("no_rtp_port"))
            raise ApiError("call_media_unavailable", "No RTP port was free for the call.", status=503) from error
        rtp: NegotiatedRtp | None = None
        kind = NegotiatedRtp if ringing.srtp is None else SecureRtp
        try:
            created = await kind.create(
                local_addr=(self.listen[0], port), remote_addr=remote, payload_type=ringing.payload_type,
                dtmf_payload_type=ringing.dtmf_payload_type or 101, jitter_prefetch=JITTER_PREFETCH)
            assert isinstance(created, NegotiatedRtp)  # create() builds its class, typed as the base
            rtp = created
            if isinstance(rtp, SecureRtp):
                assert ringing.srtp is not None
                rtp.secure(ringing.srtp)  # before any packet goes out
            actions = ringing.machine.accept()  # 409 when another accept, a CANCEL or the timer came meanwhile
        except BaseException as error:
            if rtp is not None:
                await rtp.close()
            await self._ports.release(port)
            if not isinstance(error, OSError):
                raise
            self.perform(ringing, ringing.machine.failed("rtp_unavailable"))
            raise ApiError("call_media_unavailable", "The call's RTP port could not be bound.", status=503) from error
        rtp.expected_host = remote[0]
        call = SipCall(id=call_id, session=session, rtp=rtp, rtp_port=port, ringing=ringing, front=front,
                       hang_up=lambda: self.perform(ringing, ringing.machine.hang_up()),
                       release_port=lambda: self._ports.release(port))
        if front is not None:
            call.playout = front.playout  # the session's own, at the call's 8 kHz (open_live)
        ringing.answered = call
        rtp.on_audio = call.hear
        rtp.on_dtmf = call.digit
        if front is None:
            session.attach_playout(call.playout)
        other: Surface = "realtime" if front is not None else "live"
        if (other_id := ringing.id_on(other)) is not None:
            self._surfaces[other].pop(other_id, None)
        answer, _ = negotiate_sdp(ringing.offer, self.advertise_ip, port, supported_codecs=[ringing.payload_type],
                                  dtmf_payload_type=ringing.dtmf_payload_type)
        if ringing.srtp is not None and answer.audio is not None:
            answer.audio.attributes["crypto"] = [ringing.srtp.answer_line()]  # the profile is the offer's, RTP/SAVP
        self.perform(ringing, actions, sdp=answer)
        if front is None:  # a Live session is found in the Live registry (the route adds it)
            self._registry.add(call, alias=ringing.sip_call_id)
        return call

    def reject(self, call_id: str, status_code: int, surface: Surface = "realtime") -> None:
        ringing = self.ringing_call(call_id, surface)
        self.perform(ringing, ringing.machine.reject(status_code))

    def refer(self, call_id: str, target_uri: str, surface: Surface = "realtime") -> None:
        ringing = self.ringing_call(call_id, surface)
        self.perform(ringing, ringing.machine.refer(target_uri))

    # -- the driver -------------------------------------------------------------------------------

    def perform(self, ringing: RingingCall, actions: list[Action], *, sdp: SdpMessage | None = None) -> None:
        invite = ringing.invite
        for action in actions:
            match action:
                case Answer():
                    if ringing.timer is not None:
                        ringing.timer.cancel()
                    if ringing.delivery is not None and ringing.delivery is not asyncio.current_task():
                        ringing.delivery.cancel()  # answered: the other surface's webhook need not arrive
                    invite.accept(sdp)
                    log_event("sip.call.answered", call_id=ringing.id)
                case Decline(status_code=status):
                    invite.reject(status)
                case SendBye():
                    invite.hangup()
                case SendRefer(target_uri=target):
                    uas = self._uas_of(invite)
                    assert uas.uac is not None
                    uas.uac.send_refer(invite.dialog, target, invite.source_addr)
                    log_event("sip.call.referred", call_id=ringing.id)
                case Finish(reason=reason):
                    self._finish(ringing, reason)

    def _finish(self, ringing: RingingCall, reason: str) -> None:
        if ringing.timer is not None:
            ringing.timer.cancel()
        if ringing.delivery is not None and ringing.delivery is not asyncio.current_task():
            ringing.delivery.cancel()  # the caller went: the application need not hear of the call any more
        self._surfaces["realtime"].pop(ringing.id, None)
        if ringing.live_id is not None:
            self._surfaces["live"].pop(ringing.live_id, None)
        self._by_sip_id.pop(ringing.sip_call_id, None)
        with contextlib.suppress(ValueError):
            # aiosipua keeps an ended call until the ACK of a final error, and a BYE we send forever: forgotten here.
            self._uas_of(ringing.invite)._calls.pop(ringing.sip_call_id, None)
        call = ringing.answered
        if call is not None:
            self._registry.remove(call.id)
            call.ended.set()
        else:
            log_event("sip.call.ended", call_id=ringing.id, reason=reason)

    def _uas_of(self, invite: IncomingCall) -> SipUAS:
        for uas in self._uas:
            if uas.transport is invite.transport:
                return uas
        raise ValueError("the call came on no transport of this trunk")


def _same_keys(agreed: SdesKeys | None, offered: SdesKeys | None) -> bool:
    """A re-INVITE's keys are the call's: both plain RTP, or the same suite and the caller's same key."""
    if agreed is None or offered is None:
        return agreed is offered
    return (agreed.suite, agreed.remote_key) == (offered.suite, offered.remote_key)
