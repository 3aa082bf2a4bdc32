"""`--mode sip`: phone calls over SIP, the bench as the caller and as the application that answers them.

The caller (SipPhone, one SIP user agent for the whole run, from aiosipua as the gateway's trunk is) sends an
INVITE offering PCMU and telephone-event to the gateway's --sip-listen over UDP. The gateway announces the call
to its --webhook-url, which must point at the bench's --webhook-listen: CallApplication checks each webhook with
the openai SDK (`client.webhooks.unwrap`, the gateway's --webhook-secret) and hands `realtime.call.incoming` to
the call that dialled it, matched by the SIP Call-ID among its headers. The bench then answers as an application
does, `POST /v1/realtime/calls/{call_id}/accept` with the session, and watches the call on its sideband.

The caller's RTP (aiortp) sends the microphone as 20 ms PCMU packets every 20 ms (silence between questions, as
a phone sends), and plays what arrives through a jitter buffer of JITTER_PREFETCH packets, as a phone does; the
answer is the loud frames played (gateway/bench/phone.py). The call ends with the caller's BYE.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from dataclasses import dataclass, field
from typing import Any

import httpx
import numpy as np
import openai
import uvicorn
from aiortp import PortAllocator, RTPSession
from aiosipua import SipUAC, SipUAS
from aiosipua.outgoing_call import OutgoingCall
from aiosipua.sdp_negotiate import build_sdp

from gateway.bench.clients import BenchError, Target, error_code
from gateway.bench.phone import FRAME, RATE, PhoneCallClient, session_config, watch
from gateway.protocol.sip_transports import AnyLoopUdpTransport

PCMU = 0
TELEPHONE_EVENT = 101
JITTER_PREFETCH = 2  # packets held before the first is played: 40 ms, a phone's usual start
CALLER_RTP_PORTS = (40000, 49999)  # apart from the gateway's default --sip-rtp-ports (20000-29999) on one host
INVITE_TIMEOUT_S = 5.0  # for the gateway's 180 Ringing (it sends 100 and 180 at once)
ANSWER_TIMEOUT_S = 30.0  # for its webhook, and its 200 OK after the accept


def host_port(text: str, option: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise BenchError(f"{option} must be HOST:PORT, not {text!r}")
    return host.strip("[]"), int(port)


class CallApplication:
    """The application behind the gateway's --webhook-url: an HTTP server that answers 200 to each webhook the SDK
    verifies (400 otherwise) and resolves the future of the call whose SIP Call-ID the incoming call carries."""

    def __init__(self, listen: tuple[str, int], secret: str) -> None:
        self.listen = listen
        self.bad_signatures = 0
        self._client = openai.OpenAI(api_key="unused", webhook_secret=secret, base_url="http://127.0.0.1:9/v1")
        self._waiting: dict[str, asyncio.Future[str]] = {}  # SIP Call-ID -> the gateway's call id
        self._server = uvicorn.Server(uvicorn.Config(self._app, host=listen[0], port=listen[1], log_level="warning",
                                                     lifespan="off", access_log=False, interface="asgi3"))
        self._serving: asyncio.Task[None] | None = None

    async def start(self) -> None:
        # Bound here, not by uvicorn, whose failure to bind is a SystemExit out of the bench's loop.
        listener = socket.socket(socket.AF_INET6 if ":" in self.listen[0] else socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            listener.bind(self.listen)
        except OSError as exc:
            listener.close()
            raise BenchError(f"cannot take webhooks on {self.listen[0]}:{self.listen[1]} (--webhook-listen): "
                             f"{exc.strerror or exc}") from None
        self._serving = asyncio.create_task(self._server.serve(sockets=[listener]))
        while not self._server.started:
            if self._serving.done():
                raise BenchError(f"cannot take webhooks on {self.listen[0]}:{self.listen[1]} (--webhook-listen)")
            await asyncio.sleep(0.02)

    async def stop(self) -> None:
        if self._serving is not None:
            self._server.should_exit = True
            await asyncio.gather(self._serving, return_exceptions=True)

    def expect(self, sip_call_id: str) -> asyncio.Future[str]:
        future: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self._waiting[sip_call_id] = future
        future.add_done_callback(lambda _: self._waiting.pop(sip_call_id, None))
        return future

    async def _app(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        headers = {name.decode("latin-1"): value.decode("latin-1") for name, value in scope["headers"]}
        try:
            event = self._client.webhooks.unwrap(body, headers)
        except (openai.InvalidWebhookSignatureError, ValueError):
            self.bad_signatures += 1
            status = 400
        else:
            status = 200
            if event.type == "realtime.call.incoming":
                sip_ids = [header.value for header in event.data.sip_headers if header.name.lower() == "call-id"]
                future = self._waiting.get(sip_ids[0]) if sip_ids else None
                if future is not None and not future.done():
                    future.set_result(event.data.call_id)
        await send({"type": "http.response.start", "status": status, "headers": [(b"content-length", b"0")]})
        await send({"type": "http.response.body", "body": b""})


@dataclass
class Dialled:
    """A call the phone dialled, until its webhook came: what the gateway answered so far."""

    call: OutgoingCall
    incoming: asyncio.Future[str]  # the gateway's call id, from realtime.call.incoming
    refused: asyncio.Future[str]  # the final response that refused it, "486 Busy Here"
    ringing: asyncio.Event = field(default_factory=asyncio.Event)  # 180 came: the gateway asks the application

    def refuse(self, response: str) -> None:
        if not self.refused.done():
            self.refused.set_result(response)


class SipPhone:
    """The run's SIP user agent and its application (see the module's text)."""

    def __init__(self, gateway: tuple[str, int], webhook_listen: tuple[str, int], webhook_secret: str) -> None:
        self.gateway = gateway
        self.application = CallApplication(webhook_listen, webhook_secret)
        self.local_ip = _route_to(gateway[0])
        self.rtp_ports = PortAllocator(CALLER_RTP_PORTS)
        self._transport = AnyLoopUdpTransport(local_addr=(self.local_ip, 0))
        self._uac = SipUAC(self._transport)
        self._uas = SipUAS(self._transport, user_agent="gateway-bench", uac=self._uac)
        self.hung_up: set[str] = set()  # SIP Call-IDs the gateway sent BYE on
        self._uas.on_bye = lambda call, _request: self.hung_up.add(call.call_id)

    async def start(self) -> None:
        await self.application.start()
        await self._uas.start()

    async def stop(self) -> None:
        await self._uas.stop()
        await self.application.stop()

    def dial(self, rtp_port: int) -> Dialled:
        """An INVITE offering PCMU on `rtp_port`."""
        offer = build_sdp(self.local_ip, rtp_port, PCMU, "PCMU", RATE, TELEPHONE_EVENT)
        host, port = self.gateway
        call = self._uac.send_invite(f"sip:bench@{self.local_ip}", f"sip:gateway@{host}:{port}", self.gateway, offer,
                                     user_agent="gateway-bench")
        # Its answers and its webhook come on later turns of the loop: nothing is missed by waiting from here.
        dialled = Dialled(call, self.application.expect(call.call_id), asyncio.get_running_loop().create_future())
        call.on_ringing = lambda _call: dialled.ringing.set()
        call.on_rejected = lambda _call, status, reason: dialled.refuse(f"{status} {reason}")
        return dialled

    async def announced(self, dialled: Dialled) -> str:
        """The gateway's call id, from the webhook of the call `dialled`; BenchError when the gateway does not
        ring within INVITE_TIMEOUT_S, refuses the call, or its webhook does not come."""
        where = f"{self.gateway[0]}:{self.gateway[1]}"
        ringing: asyncio.Future[Any] = asyncio.ensure_future(dialled.ringing.wait())
        try:
            waits: set[asyncio.Future[Any]] = {dialled.incoming, dialled.refused, ringing}
            done, _ = await asyncio.wait(waits, timeout=INVITE_TIMEOUT_S,
                                         return_when=asyncio.FIRST_COMPLETED)
            if not done:
                raise BenchError(f"{where} did not answer the INVITE in {INVITE_TIMEOUT_S:.0f} s: is --sip the "
                                 "gateway's --sip-listen?", "sip_unreachable")
            if dialled.incoming not in done and dialled.refused not in done:  # ringing: the application decides
                await asyncio.wait({dialled.incoming, dialled.refused}, timeout=ANSWER_TIMEOUT_S,
                                   return_when=asyncio.FIRST_COMPLETED)
        finally:
            ringing.cancel()
        if dialled.incoming.done():
            return dialled.incoming.result()
        hint = ("is the gateway's --webhook-url this bench's --webhook-listen "
                f"({self.application.listen[0]}:{self.application.listen[1]}), with the same --webhook-secret?")
        if dialled.refused.done():
            raise BenchError(f"{where} refused the call ({dialled.refused.result()}); {hint}", "call_refused")
        raise BenchError(f"no realtime.call.incoming came in {ANSWER_TIMEOUT_S:.0f} s: {hint}", "no_webhook")

    def hang_up(self, call: OutgoingCall) -> None:
        if call.call_id not in self.hung_up:
            with contextlib.suppress(ValueError):  # not answered: nothing to end
                call.hangup(self._uac)


def _route_to(host: str) -> str:
    """The local address this host reaches `host` from (what the SDP and the Via name)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect((host, 9))
        except OSError as exc:
            raise BenchError(f"cannot reach the SIP address {host}: {exc}") from None
        return str(probe.getsockname()[0])


class ListeningRtp(RTPSession):
    """aiortp's session, recording each packet's arrival for the downlink's figures (interarrival, as a phone's
    jitter buffer sees it)."""

    arrivals: list[float]

    def _handle_rtp(self, data: bytes, addr: tuple[str, int]) -> None:
        self.arrivals.append(time.perf_counter())
        super()._handle_rtp(data, addr)


class SipCallClient(PhoneCallClient):
    """Spoken turns over one SIP call of the run's SipPhone."""

    def __init__(self, target: Target, phone: SipPhone, http: httpx.AsyncClient,
                 barge_in_after_s: float | None) -> None:
        super().__init__(target, barge_in_after_s)
        self.phone = phone
        self.http = http
        self.call: OutgoingCall | None = None
        self.rtp: ListeningRtp | None = None
        self.rtp_port: int | None = None
        self._uplink: asyncio.Task[None] | None = None

    @classmethod
    async def open(cls, target: Target, phone: SipPhone, http: httpx.AsyncClient, system_prompt: str | None,
                   barge_in_after_s: float | None) -> SipCallClient:
        return await cls(target, phone, http, barge_in_after_s)._dialled(system_prompt)

    async def _call(self, system_prompt: str | None) -> None:
        self.rtp_port, _ = await self.phone.rtp_ports.allocate()
        created = await ListeningRtp.create(local_addr=(self.phone.local_ip, self.rtp_port),
                                            remote_addr=(self.phone.gateway[0], 9), payload_type=PCMU,
                                            dtmf_payload_type=TELEPHONE_EVENT, jitter_prefetch=JITTER_PREFETCH)
        assert isinstance(created, ListeningRtp)  # create() builds its class, typed as the base
        self.rtp = created
        self.rtp.arrivals = []
        self.rtp.on_audio = self._heard
        dialled = self.phone.dial(self.rtp_port)
        self.call = dialled.call
        call_id = await self.phone.announced(dialled)
        body = {"type": "realtime", **session_config(self.target, system_prompt)}
        try:
            accepted = await self.http.post(f"{self.target.url}/v1/realtime/calls/{call_id}/accept", json=body,
                                            headers=self.target.headers)
        except httpx.HTTPError as exc:
            raise BenchError(f"cannot reach {self.target.url}: {exc}") from None
        if accepted.status_code != 200:
            code = error_code(accepted.status_code, accepted.content)
            raise BenchError(f"accept answered {accepted.status_code}: {code}", code)
        try:
            await self.call.wait_answered(ANSWER_TIMEOUT_S)
        except (TimeoutError, RuntimeError) as exc:
            raise BenchError(f"the call was not answered: {exc}", "not_answered") from None
        answer = self.call.sdp_answer
        remote = answer.rtp_address if answer is not None else None
        if remote is None:
            raise BenchError("the gateway's answer named no RTP address", "bad_sdp")
        self.rtp.update_remote(remote)
        self._uplink = asyncio.create_task(self._speak())
        self.watching(await watch(self.target.url, call_id, self.target.headers))

    def _heard(self, pcm: bytes, _timestamp: int) -> None:
        self.played(time.perf_counter(), np.frombuffer(pcm, dtype=np.int16))

    async def _speak(self) -> None:
        """The microphone, one 20 ms packet every 20 ms on the RTP clock."""
        assert self.rtp is not None
        timestamp = 0
        while True:
            pcm = await self.mic.next_chunk()  # always on: silence between what is said
            self.rtp.send_audio_pcm((pcm if pcm is not None else np.zeros(FRAME, np.int16)).tobytes(), timestamp)
            timestamp = (timestamp + FRAME) & 0xFFFFFFFF

    async def link_stats(self) -> dict[str, Any]:
        """The downlink as the caller's RTP saw it: RFC 3550 loss and jitter, and the packets' interarrival."""
        if self.rtp is None:
            return self.audio_stats()
        stats = self.rtp.stats
        arrivals = self.rtp.arrivals
        gaps = [1000 * (later - earlier) for earlier, later in zip(arrivals, arrivals[1:], strict=False)]
        return {
            "rtp_packets_received": stats.get("packets_received"),
            "rtp_packets_lost": stats.get("packets_lost"),
            "rtp_jitter_ms": round(stats["jitter"] / (RATE / 1000), 2) if stats.get("jitter") is not None else None,
            "packet_gaps_over_40ms": sum(gap > 40 for gap in gaps),
            **self.audio_stats(),
        }

    async def close(self) -> None:
        if self._uplink is not None:
            self._uplink.cancel()
            await asyncio.gather(self._uplink, return_exceptions=True)
        await super().close()
        if self.call is not None:
            self.phone.hang_up(self.call)
        if self.rtp is not None:
            await self.rtp.close()
        if self.rtp_port is not None:
            await self.phone.rtp_ports.release(self.rtp_port)

