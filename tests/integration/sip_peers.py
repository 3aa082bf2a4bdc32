"""The peers of a SIP call test, all on loopback: the application behind --webhook-url (it checks every webhook
with the openai SDK, as an application does), SIPp (Debian's sip-tester) as the caller, and the caller's ear: the
UDP port the caller's SDP names, where the gateway's RTP is recorded; and baresip, a softphone, for SRTP."""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import json
import queue
import shutil
import socket
import struct
import threading
import time
import wave
from collections import defaultdict
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import numpy as np
import openai
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from media.codecs import alaw_decode, ulaw_decode, ulaw_encode

SCENARIOS = Path(__file__).parent / "sipp"
RATE = 8000
WEBHOOK_SECRET = "whsec_" + "c2lwLWNhbGwtdGVzdHMtc2VjcmV0LWtleQ=="  # base64 of a test key


def sipp_available() -> bool:
    return shutil.which("sipp") is not None


def free_port(kind: int = socket.SOCK_DGRAM, *, even: bool = False) -> int:
    """A free port on loopback (UDP by default; an even one, with the next free too, for RTP and RTCP)."""
    while True:
        with socket.socket(socket.AF_INET, kind) as probe:
            probe.bind(("127.0.0.1", 0))
            port = int(probe.getsockname()[1])
        if not even or (port % 2 == 0 and port < 65535):
            return port


class WebhookApplication:
    """An HTTP server on loopback that takes the gateway's webhooks: each is unwrapped with the openai SDK's
    `client.webhooks.unwrap` (so a bad signature fails the test) and queued by type (an SRTP call is announced on
    both surfaces, in either order). `answer_status` is what it answers."""

    def __init__(self) -> None:
        self.events: defaultdict[str, queue.Queue[Any]] = defaultdict(queue.Queue)
        self.answer_status = 200
        self.tries = 0
        self.bad_signatures = 0
        client = openai.OpenAI(api_key="unused", webhook_secret=WEBHOOK_SECRET, base_url="http://127.0.0.1:9/v1")
        application = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", "0")))
                application.tries += 1
                if application.answer_status == 200:
                    try:
                        event = client.webhooks.unwrap(body, dict(self.headers.items()))
                        application.events[event.type].put(event)
                    except openai.InvalidWebhookSignatureError:
                        application.bad_signatures += 1
                        self.send_response(400)
                        self.end_headers()
                        return
                self.send_response(application.answer_status)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}/hooks"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    async def next_event(self, kind: str = "realtime.call.incoming", timeout: float = 30.0) -> Any:
        return await asyncio.to_thread(self.events[kind].get, True, timeout)

    def forget(self) -> None:
        """The events no test took (the other surface's announcements of earlier calls)."""
        self.events.clear()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


@dataclass
class RtpRecorder(asyncio.DatagramProtocol):
    """The caller's ear: the G.711 the gateway sends, by arrival time, with what the RTP headers said."""

    heard: list[tuple[float, np.ndarray]] = field(default_factory=list)
    sequence: list[int] = field(default_factory=list)
    timestamps: list[int] = field(default_factory=list)
    sources: set[tuple[str, int]] = field(default_factory=set)
    transport: asyncio.DatagramTransport | None = None

    @classmethod
    async def listen(cls, port: int) -> RtpRecorder:
        recorder = cls()
        await asyncio.get_running_loop().create_datagram_endpoint(lambda: recorder, local_addr=("127.0.0.1", port))
        return recorder

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is not asyncio's class

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        if len(data) < 12 or data[0] >> 6 != 2:
            return
        payload_type = data[1] & 0x7F
        sequence, timestamp = struct.unpack("!HI", data[2:8])
        payload = data[12 + 4 * (data[0] & 0x0F):]
        if payload_type not in (0, 8):
            return
        self.sources.add(addr)
        self.sequence.append(sequence)
        self.timestamps.append(timestamp)
        self.heard.append((time.monotonic(), ulaw_decode(payload) if payload_type == 0 else alaw_decode(payload)))

    def audio_between(self, start: float, end: float) -> np.ndarray:
        parts = [pcm for at, pcm in self.heard if start <= at <= end]
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int16)

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()


def write_mulaw(path: Path, pcm_8k: np.ndarray) -> Path:
    """A raw mu-law file, as SIPp's rtp_stream plays it."""
    path.write_bytes(ulaw_encode(pcm_8k))
    return path


SIP_USER, SIP_PASSWORD = "trunk", "digest-test-password"  # the gateway's --sip-auth in the SIP tests


def scenario(name: str, folder: Path, *, password: str | None = SIP_PASSWORD, **values: str) -> Path:
    """A scenario of tests/integration/sipp/ with its @NAME@ places filled in, written to `folder`. With a
    `password` its INVITE first takes the gateway's digest challenge: sent once bare (401, acknowledged), then again
    with SIPp's own answer to the challenge in an Authorization header, as SIP_USER."""
    text = (SCENARIOS / name).read_text()
    for key, value in values.items():
        text = text.replace(f"@{key}@", value)
    if password is not None and "CSeq: 1 INVITE" in text:
        start = text.index('<send retrans="500">')
        end = text.index("</send>", start) + len("</send>")
        invite = text[start:end]
        challenge = '''
  <recv response="100" optional="true"/>
  <recv response="401" auth="true"/>
  <send>
    <![CDATA[
      ACK sip:assistant@[remote_ip]:[remote_port] SIP/2.0
      [last_Via:]
      [last_From:]
      [last_To:]
      Call-ID: [call_id]
      CSeq: 1 ACK
      Max-Forwards: 70
      Content-Length: 0
    ]]>
  </send>
'''
        answered = invite.replace("CSeq: 1 INVITE", "CSeq: 2 INVITE").replace(
            "Max-Forwards: 70", f"Max-Forwards: 70\n      [authentication username={SIP_USER} password={password}]", 1)
        rest = text[end:].replace("CSeq: 1 ACK", "CSeq: 2 ACK")
        text = text[:start] + invite + challenge + answered + rest
    path = folder / name
    path.write_text(text)
    return path


async def start_sipp(scenario_path: Path, gateway_sip_port: int, *, transport: str = "u1",
                     extra: tuple[str, ...] = ()) -> asyncio.subprocess.Process:
    """One call of `scenario_path` to the gateway: SIPp's own SIP and media ports are free loopback ports."""
    media = free_port(even=True)
    return await asyncio.create_subprocess_exec(
        "sipp", f"127.0.0.1:{gateway_sip_port}", "-sf", str(scenario_path), "-m", "1", "-l", "1",
        "-i", "127.0.0.1", "-mi", "127.0.0.1", "-p", str(free_port()), "-mp", str(media),
        "-t", transport,
        "-timeout", "300", "-timeout_error", "-nostdin", "-trace_err", *extra,
        cwd=scenario_path.parent, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)


def event_json(event: Any) -> dict[str, Any]:
    return json.loads(event.model_dump_json())


def baresip_available() -> bool:
    return shutil.which("baresip") is not None


@dataclass
class Baresip:
    """Debian's baresip dialling the gateway: it speaks a WAV (its aufile source) and records what it hears
    (its sndfile filter, `heard()`). Its SIP and SRTP are libre's, not the gateway's libraries."""

    process: asyncio.subprocess.Process
    folder: Path
    console_port: int  # its cons module's port: commands typed there are its console's (press)

    @classmethod
    async def dial(cls, folder: Path, gateway_sip_port: int, speech_8k: np.ndarray, *, media: str = "srtp-mand",
                   transport: str = "udp", password: str = SIP_PASSWORD) -> Baresip:
        """`media`: the account's mediaenc (srtp-mand: RTP/SAVP with SDES keys); `transport`: udp, tcp or tls (to
        the port given). The WAV is all the call has to say: baresip hangs up where it ends."""
        console_port = free_port(socket.SOCK_STREAM)  # cons listens on UDP and TCP both
        folder.mkdir(parents=True, exist_ok=True)
        with wave.open(str(folder / "speech.wav"), "wb") as wav:
            wav.setnchannels(1)
            wav.setsampwidth(2)
            wav.setframerate(RATE)
            wav.writeframes(speech_8k.astype(np.int16).tobytes())
        (folder / "config").write_text("\n".join([
            f"sip_listen 127.0.0.1:{free_port(socket.SOCK_STREAM)}",  # UDP and TCP both: one free for TCP
            f"audio_source aufile,{folder / 'speech.wav'}", "audio_player aubridge,nowhere",
            f"cons_listen 127.0.0.1:{console_port}",
            "audio_alert aubridge,nowhere", f"snd_path {folder}", "module_path /usr/lib/baresip/modules",
            *(f"module {name}.so" for name in ("g711", "aufile", "aubridge", "srtp", "sndfile", "cons")),
            "module_tmp uuid.so", "module_tmp account.so", "module_app menu.so", ""]))
        (folder / "accounts").write_text(
            f"<sip:{SIP_USER}@127.0.0.1;transport={transport}>;regint=0;auth_pass={password};mediaenc={media};"
            "audio_codecs=PCMU\n")
        process = await asyncio.create_subprocess_exec(
            "baresip", "-4", "-n", "127.0.0.1", "-f", str(folder), "-t", "120",
            "-e", f"/dial sip:assistant@127.0.0.1:{gateway_sip_port};transport={transport}",
            stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
        return cls(process, folder, console_port)

    def press(self, keys: str) -> None:
        """Keys on its keypad, by its console's `/sndcode`: in a call, each goes out as RFC 4733 events."""
        self.command(f"/sndcode {keys}")

    def command(self, line: str) -> None:
        """A command typed on its console (`/hangup`, `/sndcode 12#`), run before this returns."""
        with socket.create_connection(("127.0.0.1", self.console_port), timeout=5) as console:
            console.sendall(f"{line}\n".encode())
            echo = b""
            while b"\n" not in echo and (more := console.recv(4096)):  # the command line echoed: it has run
                echo += more

    def heard(self) -> np.ndarray:
        """What baresip decoded from the gateway's stream (8 kHz)."""
        recordings = sorted(self.folder.glob("dump-*-dec.wav"))
        if not recordings:
            return np.zeros(0, np.int16)
        with wave.open(str(recordings[-1])) as wav:
            return np.frombuffer(wav.readframes(wav.getnframes()), np.int16)

    async def wait_for(self, text: str, timeout: float) -> str:
        """Its console up to the first line with `text`."""
        assert self.process.stdout is not None
        console: list[str] = []

        async def read() -> None:
            while line := (await self.process.stdout.readline()).decode(errors="replace"):  # type: ignore[union-attr]
                console.append(line)
                if text in line:
                    return
            raise AssertionError(f"baresip exited before saying {text!r}: {''.join(console)[-2000:]}")

        await asyncio.wait_for(read(), timeout)
        return "".join(console)

    async def stop(self) -> None:
        """SIGTERM, on which it closes its recordings (their WAV headers written), then waits for it."""
        if self.process.returncode is None:
            self.process.terminate()
            try:
                await asyncio.wait_for(self.process.wait(), 10)
            except TimeoutError:
                self.process.kill()
                await self.process.wait()


def self_signed_certificate(folder: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 signed by its own key, as PEM files (certificate, key) in `folder`."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    certificate = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
                   .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
                   .not_valid_after(now + datetime.timedelta(days=1))
                   .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                                  critical=False)
                   .sign(key, hashes.SHA256()))
    cert_path, key_path = folder / "sip-cert.pem", folder / "sip-key.pem"
    cert_path.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_path, key_path


def free_sip_port() -> int:
    """A free loopback port for --sip-listen (UDP and TCP) whose next port is free for TLS."""
    while True:
        port = free_port()
        try:
            for kind, candidate in ((socket.SOCK_STREAM, port), (socket.SOCK_STREAM, port + 1)):
                with socket.socket(socket.AF_INET, kind) as probe:
                    probe.bind(("127.0.0.1", candidate))
        except OSError:
            continue
        return port
