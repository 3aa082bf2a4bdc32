"""Speech over a reply, as a new user meets it over WebRTC: an aiortc peer as a browser (the microphone on the
track, events on `oai-events`) speaks, in voices the gateway never heard (espeak-ng's), over a long spoken reply,
one second after its audio began; and mid-thought pauses to an idle session. Prints JSON.

    python -m benchmarks.overlap [--gateway-url URL | --cwd CHECKOUT] [--load N] [--out report.json]

For each turn detector (server_vad, semantic_vad with eagerness auto), each trial a fresh call:
- backchannels ("Yeah.", "Okay.", ...): did the reply stop (`output_audio_buffer.cleared` or a cancelled
  `response.done`), or play on (the backchannel's turn deleted);
- interruptions ("Stop. Wait a second.", ...): did the reply stop;
- mid-thought pauses (750 ms of silence inside the sentence, to an idle session): one user turn, or two.
The reply's pause over a backchannel is read from the received audio (the longest run of silent 20 ms frames
from the clip's start until 4 s later: the held reply sends silence; a pause between two of Piper's clauses in
that window counts too, so it is an upper bound), and, where the gateway has it, from
`gateway_reply_pause_seconds`. `--load N` runs N busy processes at the lowest priority beside it, as a build.
Without --gateway-url it starts `python -m gateway serve` in --cwd (default this checkout) on loopback.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import fractions
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from benchmarks.voices import EspeakSpeaker

RATE = 48000
FRAME = 960  # 20 ms
SILENT_RMS = 300.0  # a received frame quieter than this is no reply audio (the bench's LOUD_RMS)
REPLY_PROMPT = "Tell me a long story about a dragon who loves books."
BACKCHANNELS = ["Yeah.", "Okay.", "Uh huh.", "Right.", "Got it."]
INTERRUPTIONS = ["Stop. Wait a second.", "No, tell me about cats instead.", "Hold on, I have a question."]
PAUSED = [("I would like to book a flight to", "Paris on Friday."),
          ("Can you remind me to call my", "mother tomorrow morning.")]
PAUSE_S = 0.75
VOICES = (EspeakSpeaker("en-us", 175), EspeakSpeaker("en-us+f3", 150), EspeakSpeaker("en-gb", 190))
DETECTORS = ("server_vad", "semantic_vad")


def longest_silence_s(frames: list[tuple[float, float]], start: float, end: float) -> float:
    """The longest run of silent frames (arrival time, RMS) between `start` and `end`, in seconds of frames."""
    longest = run = 0
    for at, rms in frames:
        if at < start or at > end:
            continue
        run = run + 1 if rms < SILENT_RMS else 0
        longest = max(longest, run)
    return longest * FRAME / RATE


def reply_stopped(events: list[dict[str, Any]], response_id: str | None) -> bool:
    """Whether the reply was cut: its playout cleared, or its response.done cancelled."""
    for event in events:
        if event["type"] == "output_audio_buffer.cleared":
            return True
        if (event["type"] == "response.done" and event["response"]["id"] == response_id
                and event["response"]["status"] == "cancelled"):
            return True
    return False


def percentiles(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"p50": None, "p95": None, "n": 0}
    ordered = sorted(values)
    return {"p50": round(statistics.median(ordered), 3),
            "p95": round(ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))], 3), "n": len(ordered)}


@dataclass
class Peer:
    """The browser's side: the microphone plays queued clips, then silence; events and received frames are kept."""

    pc: Any
    channel: Any
    events: list[dict[str, Any]] = field(default_factory=list)
    frames: list[tuple[float, float]] = field(default_factory=list)  # (arrival, RMS) of each received frame
    opened: asyncio.Event = field(default_factory=asyncio.Event)
    mic: list[np.ndarray] = field(default_factory=list)

    def play(self, pcm: np.ndarray) -> float:
        padded = np.concatenate([pcm, np.zeros((-pcm.size) % FRAME, dtype=np.int16)])
        self.mic.extend(padded.reshape(-1, FRAME))
        return time.monotonic()

    def send(self, event: dict[str, Any]) -> None:
        self.channel.send(json.dumps(event))

    async def wait(self, kind: str, timeout: float, since: int = 0) -> dict[str, Any] | None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for event in self.events[since:]:
                if event["type"] == kind:
                    return event
            await asyncio.sleep(0.02)
        return None


async def open_call(url: str, session: dict[str, Any]) -> tuple[Peer, str]:
    from aiortc import MediaStreamTrack, RTCConfiguration, RTCPeerConnection, RTCSessionDescription
    from aiortc.mediastreams import MediaStreamError
    from av import AudioFrame

    pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    peer = Peer(pc, pc.createDataChannel("oai-events"))
    peer.channel.on("message", lambda message: peer.events.append({**json.loads(message), "_at": time.monotonic()}))
    peer.channel.on("open", peer.opened.set)

    class Microphone(MediaStreamTrack):
        kind = "audio"

        def __init__(self) -> None:
            super().__init__()
            self.start: float | None = None
            self.pts = 0

        async def recv(self) -> AudioFrame:
            if self.start is None:
                self.start = time.monotonic()
            else:
                self.pts += FRAME
                await asyncio.sleep(max(0.0, self.start + self.pts / RATE - time.monotonic()))
            pcm = peer.mic.pop(0) if peer.mic else np.zeros(FRAME, dtype=np.int16)
            frame = AudioFrame.from_ndarray(pcm.reshape(1, -1), format="s16", layout="mono")
            frame.sample_rate, frame.pts, frame.time_base = RATE, self.pts, fractions.Fraction(1, RATE)
            return frame

    pc.addTrack(Microphone())

    @pc.on("track")
    def on_track(track: MediaStreamTrack) -> None:
        async def listen() -> None:
            with contextlib.suppress(MediaStreamError):
                while True:
                    frame = await track.recv()
                    pcm = frame.to_ndarray().astype(np.float64)
                    peer.frames.append((time.monotonic(), float(np.sqrt(np.mean(pcm**2)))))

        asyncio.ensure_future(listen())

    await pc.setLocalDescription(await pc.createOffer())
    async with httpx.AsyncClient(base_url=url, timeout=30) as http:
        secret = (await http.post("/v1/realtime/client_secrets", json={"session": session})).json()["value"]
        answer = await http.post("/v1/realtime/calls", content=pc.localDescription.sdp,
                                 headers={"content-type": "application/sdp", "authorization": f"Bearer {secret}"})
    answer.raise_for_status()
    await pc.setRemoteDescription(RTCSessionDescription(sdp=answer.text, type="answer"))
    await asyncio.wait_for(peer.opened.wait(), 10)
    return peer, answer.headers["location"]


async def hang_up(url: str, peer: Peer, location: str) -> None:
    async with httpx.AsyncClient(base_url=url, timeout=10) as http:
        await http.post(f"{location}/hangup")
    await peer.pc.close()


async def pause_metric(url: str) -> tuple[float, float] | None:
    """gateway_reply_pause_seconds{outcome="resumed"} (sum, count), if the gateway has it."""
    from prometheus_client.parser import text_string_to_metric_families

    async with httpx.AsyncClient(base_url=url, timeout=10) as http:
        text = (await http.get("/metrics")).text
    found = None
    for family in text_string_to_metric_families(text):
        if family.name == "gateway_reply_pause_seconds":
            sums = {s.name: s.value for s in family.samples if s.labels.get("outcome") == "resumed"}
            found = (sums.get("gateway_reply_pause_seconds_sum", 0.0), sums.get("gateway_reply_pause_seconds_count", 0.0))
    return found


async def over_reply(url: str, detection: str, pcm: np.ndarray) -> dict[str, Any]:
    """One clip over a long reply: whether the reply stopped, and how long its audio paused."""
    session = {"temperature": 0, "max_output_tokens": 120,
               "audio": {"input": {"turn_detection": {"type": detection}}}}
    peer, location = await open_call(url, session)
    try:
        peer.send({"type": "conversation.item.create", "item": {"type": "message", "role": "user", "content": [
            {"type": "input_text", "text": REPLY_PROMPT}]}})
        peer.send({"type": "response.create"})
        started = await peer.wait("output_audio_buffer.started", 60)
        created = await peer.wait("response.created", 1)
        if started is None or created is None:
            return {"error": "the reply never started"}
        await asyncio.sleep(1.0)
        before = await pause_metric(url)
        mark = len(peer.events)
        at = peer.play(pcm)
        deadline = at + 8.0
        while time.monotonic() < deadline:  # decided: its turn deleted, or the reply stopped
            later = peer.events[mark:]
            if reply_stopped(later, created["response"]["id"]) or any(
                    e["type"] == "conversation.item.deleted" for e in later):
                break
            await asyncio.sleep(0.05)
        await asyncio.sleep(max(0.0, at + 4.0 - time.monotonic()))
        after = await pause_metric(url)
        later = peer.events[mark:]
        result: dict[str, Any] = {
            "stopped": reply_stopped(later, created["response"]["id"]),
            "turn_deleted": any(e["type"] == "conversation.item.deleted" for e in later),
            "audio_gap_s": round(longest_silence_s(peer.frames, at, at + 4.0), 3),
            "events": [[round(e["_at"] - at, 3), e["type"]] for e in later if not e["type"].endswith(".delta")][:40],
        }
        if before is not None and after is not None and after[1] > before[1]:
            result["held_s"] = round((after[0] - before[0]) / (after[1] - before[1]), 3)
        return result
    finally:
        await hang_up(url, peer, location)


async def paused_utterance(url: str, detection: str, pcm: np.ndarray) -> dict[str, Any]:
    """A sentence with a mid-thought pause to an idle session: how many user turns it made."""
    peer, location = await open_call(url, {"temperature": 0, "max_output_tokens": 16,
                                           "audio": {"input": {"turn_detection": {"type": detection}}}})
    try:
        await peer.wait("session.created", 10)
        mark = len(peer.events)
        at = peer.play(pcm)
        await asyncio.sleep(len(pcm) / RATE + 4.0)
        commits = [e for e in peer.events[mark:] if e["type"] == "input_audio_buffer.committed"]
        return {"turns": len(commits), "commits_at_s": [round(e["_at"] - at, 3) for e in commits]}
    finally:
        await hang_up(url, peer, location)


def clips() -> dict[str, list[tuple[str, str, np.ndarray]]]:
    """(voice, text, 48 kHz int16) for each kind; the voices take turns."""
    out: dict[str, list[tuple[str, str, np.ndarray]]] = {"backchannel": [], "interruption": [], "paused": []}
    for i, text in enumerate(BACKCHANNELS):
        voice = VOICES[i % len(VOICES)]
        out["backchannel"].append((voice.name, text, voice.say(text, RATE).pcm))
    for i, text in enumerate(INTERRUPTIONS):
        voice = VOICES[i % len(VOICES)]
        out["interruption"].append((voice.name, text, voice.say(text, RATE).pcm))
    for i, (head, tail) in enumerate(PAUSED):
        voice = VOICES[i % len(VOICES)]
        first, second = voice.say(head, RATE), voice.say(tail, RATE)
        pause = np.zeros(int(PAUSE_S * RATE), dtype=np.int16)
        out["paused"].append((voice.name, f"{head} ... {tail}",
                              np.concatenate([first.pcm[:first.end], pause, second.pcm[second.onset:]])))
    return out


async def measure(url: str, detectors: tuple[str, ...]) -> dict[str, Any]:
    spoken = clips()
    report: dict[str, Any] = {}
    for detection in detectors:
        trials: dict[str, list[dict[str, Any]]] = {"backchannel": [], "interruption": [], "paused": []}
        for kind in ("backchannel", "interruption"):
            for voice, text, pcm in spoken[kind]:
                trials[kind].append({"voice": voice, "text": text, **await over_reply(url, detection, pcm)})
        for voice, text, pcm in spoken["paused"]:
            trials["paused"].append({"voice": voice, "text": text, **await paused_utterance(url, detection, pcm)})
        backchannels = [t for t in trials["backchannel"] if "error" not in t]
        interruptions = [t for t in trials["interruption"] if "error" not in t]
        report[detection] = {
            "backchannels_that_stopped_the_reply": f"{sum(t['stopped'] for t in backchannels)} of {len(backchannels)}",
            "interruptions_that_stopped_it": f"{sum(t['stopped'] for t in interruptions)} of {len(interruptions)}",
            "pauses_kept_one_turn": f"{sum(t['turns'] == 1 for t in trials['paused'])} of {len(trials['paused'])}",
            "backchannel_audio_gap_s": percentiles([t["audio_gap_s"] for t in backchannels if not t["stopped"]]),
            "backchannel_held_s": percentiles([t["held_s"] for t in backchannels if "held_s" in t]),
            "trials": trials,
        }
    return report


def cpu_model() -> str:
    info = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    fields = dict(line.split(":", 1) for line in info.splitlines() if ":" in line)
    fields = {k.strip(): v.strip() for k, v in fields.items()}
    return f"{fields.get('model name', 'unknown')} (family {fields.get('cpu family', '?')}, model {fields.get('model', '?')})"


@contextlib.contextmanager
def busy(count: int, seconds: float) -> Any:
    """`count` busy processes at the lowest priority, bounded in time: a build beside the gateway."""
    spin = f"import time\nend = time.monotonic() + {seconds}\nwhile time.monotonic() < end: pass"
    procs = [subprocess.Popen(["nice", "-n", "19", sys.executable, "-c", spin]) for _ in range(count)]
    try:
        yield
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


@contextlib.contextmanager
def gateway(cwd: Path, port: int, log: Path) -> Any:
    with log.open("w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "gateway", "serve", "--host", "127.0.0.1", "--port", str(port),
                                 "--ice-host-addresses", "127.0.0.1"], cwd=cwd, stdout=out, stderr=subprocess.STDOUT,
                                env={**os.environ, "PYTHONPATH": str(cwd)})
        try:
            url = f"http://127.0.0.1:{port}"
            deadline = time.monotonic() + 300
            while time.monotonic() < deadline:
                with contextlib.suppress(httpx.HTTPError):
                    if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                        break
                if proc.poll() is not None:
                    raise RuntimeError(f"the gateway exited; see {log}")
                time.sleep(1)
            else:
                raise RuntimeError(f"the gateway never became ready; see {log}")
            yield url
        finally:
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gateway-url", help="measure this running gateway (its --ice-host-addresses must reach here)")
    parser.add_argument("--cwd", type=Path, default=Path.cwd(), help="the checkout whose gateway to start")
    parser.add_argument("--port", type=int, default=8790)
    parser.add_argument("--load", type=int, default=0, help="busy processes at the lowest priority beside it")
    parser.add_argument("--detectors", default=",".join(DETECTORS))
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    from gateway.bench.webrtc import offer_only

    offer_only("127.0.0.1")
    detectors = tuple(d for d in args.detectors.split(",") if d)
    with contextlib.ExitStack() as stack:
        url = args.gateway_url or stack.enter_context(gateway(args.cwd.resolve(), args.port,
                                                              Path(f"/tmp/overlap-gateway-{args.port}.log")))
        stack.enter_context(busy(args.load, 3600))
        report = {"cpu": cpu_model(), "load": args.load, "gateway": str(args.cwd.resolve()) if not args.gateway_url else url,
                  "voices": [v.name for v in VOICES], **asyncio.run(measure(url, detectors))}
    text = json.dumps(report, indent=1)
    print(text)
    if args.out is not None:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
