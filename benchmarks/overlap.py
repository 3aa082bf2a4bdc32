"""Speech over a reply, as a new user meets it over WebRTC. Prints JSON.

    python -m benchmarks.overlap [--gateway-url URL | --cwd CHECKOUT] [--detectors server_vad,semantic_vad]
                                 [--load 0,2] [--out report.json]

An aiortc peer stands in for a browser (gateway/bench/webrtc.py's RealtimeCallClient: the microphone, an always-on
48 kHz track paced in 20 ms frames, events on `oai-events`, the answer on the server's track) and speaks in
voices the gateway never heard (espeak-ng's: en-us, en-us+f3 and en-gb, at three speeds, taking turns). For each
turn detector (`server_vad`; `semantic_vad`, eagerness auto; set with session.update) and each `--load` (N busy
processes at nice 19 beside it, bounded in time and killed at the end), every trial is a fresh call, hung up
after it (POST {Location}/hangup), after one warm-up trial that is not counted (the first call runs cold):

- over a reply: "Tell me a long story about a dragon who loves books." (conversation.item.create, response.create;
  temperature 0, max_output_tokens 120); once output_audio_buffer.started came and 1.0 s passed, one clip:
  - backchannels ("Yeah.", "Okay.", "Uh huh.", "Right.", "Got it."): the reply is `cut` (its response.done
    cancelled, or output_audio_buffer.cleared) or `played_on` (the backchannel's committed turn deleted,
    conversation.item.deleted, and the reply not cut); also `no_turn` (no committed turn, not cut) or
    `no_verdict` (a turn, neither deleted nor cut when the trial ended);
  - interruptions ("Stop. Wait a second.", ...): cut or not;
- mid-thought pauses, to an idle session: "I would like to book a flight to" + 750 ms of silence + "Paris on
  Friday.": one user turn (one input_audio_buffer.committed) or two (the turn ended early).

The reply's pause over a backchannel. Where the gateway has `gateway_reply_pause_seconds{outcome}`, the
difference of its sum and count before and after the trial is the hold's length (`metric_pause_s`). Always,
from the received audio (`audio_pause_s`): a 20 ms frame is loud above the bench's LOUD_RMS (300 of int16; the
held reply's silence frames decode to about 0); a silence runs from one loud frame to the next, so a frame that
never came counts as silent, as it would be to a listener. `raw_silence_s` is the longest silence overlapping
the 3 s from the clip's speech onset, taken whole (a hold that outlasts the 3 s is not cut there); the reply has
silences of its own (between words, clauses, sentences; and the TTS falling behind on a busy machine), so
`natural_silence_s` is the median, over every 3 s stretch of the trials' replies after that silence ended, of
the longest silence in it: what 3 s of this reply hold without a hold. The estimate is raw minus natural,
at least 0. It is the hold to within the natural silence it joined (zero to a sentence gap): a hold shorter
than the reply's own pauses is not seen; the metric, where present, is the exact figure.

Without --gateway-url it starts `python -m gateway serve --host 127.0.0.1 --port P --ice-host-addresses 127.0.0.1`
with this interpreter in --cwd (default: this checkout), so a git worktree of an older commit serves its own
code: the report names the gateway, inference and media modules that interpreter imports there, and the commit.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.voices import EspeakSpeaker
from gateway.platform.processes import GatewayProcess, free_port, get_json

MODEL = "smollm2-135m-instruct"
RATE = 48000  # the microphone track's rate (gateway.bench.webrtc.RTC_RATE)
FRAME_S = 0.02
WINDOW_S = 3.0  # the reply's pause is looked for from the clip's onset until this much later
RECORD_S = 9.0  # how long after the clip's onset a trial over a reply listens (the window, a hold, natural stretches)
CUT_TAIL_S = 0.5  # how long a trial listens on after the reply was cut
REPLY_PROMPT = "Tell me a long story about a dragon who loves books."
REPLY_TOKENS = 120
BACKCHANNELS = ("Yeah.", "Okay.", "Uh huh.", "Right.", "Got it.")
INTERRUPTIONS = ("Stop. Wait a second.", "No, tell me about cats instead.", "Hold on, I have a question.")
PAUSED = (("I would like to book a flight to", "Paris on Friday."),
          ("Can you remind me to call my", "mother tomorrow morning."))
MID_PAUSE_S = 0.75
VOICES = (EspeakSpeaker("en-us", 175), EspeakSpeaker("en-us+f3", 150), EspeakSpeaker("en-gb", 190))
DETECTORS = ("server_vad", "semantic_vad")
TURN_DETECTION: dict[str, dict[str, Any]] = {"server_vad": {"type": "server_vad"},
                                             "semantic_vad": {"type": "semantic_vad", "eagerness": "auto"}}
CUT_EVENTS = ("output_audio_buffer.cleared",)


# ---- pure: what an event log and the received audio say ----

def reply_cut(events: Sequence[dict[str, Any]], reply_id: str | None) -> bool:
    """Whether the reply was cut: its playout cleared, or its response.done cancelled."""
    for event in events:
        if event.get("type") in CUT_EVENTS and event.get("response_id") in (None, reply_id):
            return True
        response = event.get("response") or {}
        if event.get("type") == "response.done" and response.get("id") == reply_id \
                and response.get("status") == "cancelled":
            return True
    return False


def classify(events: Sequence[dict[str, Any]], reply_id: str | None) -> str:
    """What speech over a reply did, from the events that came after it began: `cut`, `played_on` (its committed
    turn deleted, the reply not cut), `no_turn` (no turn committed, not cut) or `no_verdict`."""
    if reply_cut(events, reply_id):
        return "cut"
    committed = {e.get("item_id") for e in events if e.get("type") == "input_audio_buffer.committed"}
    if any(e.get("type") == "conversation.item.deleted" and e.get("item_id") in committed for e in events):
        return "played_on"
    return "no_verdict" if committed else "no_turn"


def decided(events: Sequence[dict[str, Any]], reply_id: str | None) -> bool:
    return classify(events, reply_id) in ("cut", "played_on")


def user_turns(events: Sequence[dict[str, Any]]) -> int:
    return sum(e.get("type") == "input_audio_buffer.committed" for e in events)


def silences(loud: Sequence[float], until: float, frame_s: float = FRAME_S) -> list[tuple[float, float]]:
    """The silences in the received audio, (start, end) in arrival time, from the arrival times of its loud frames
    (sorted): each frame sounds for `frame_s`; a silence ends at the next loud frame, or at `until` (the end of the
    recording) after the last one. Gaps under half a frame are arrival jitter, not silence."""
    runs = [(a + frame_s, b) for a, b in zip(loud, loud[1:], strict=False) if b - a - frame_s >= frame_s / 2]
    if loud and until - loud[-1] - frame_s >= frame_s / 2:
        runs.append((loud[-1] + frame_s, until))
    return runs


def hold_silence(loud: Sequence[float], onset: float, until: float, window_s: float = WINDOW_S,
                 frame_s: float = FRAME_S) -> tuple[float, float, bool] | None:
    """The longest silence overlapping [onset, onset + window_s], whole: (its length, its end, whether the
    recording ended in it). None when no reply audio came before `onset`."""
    if not loud or loud[0] > onset:
        return None
    overlapping = [(a, b) for a, b in silences(loud, until, frame_s) if a < onset + window_s and b > onset]
    if not overlapping:
        return 0.0, onset, False
    start, end = max(overlapping, key=lambda run: run[1] - run[0])
    return end - start, end, end >= until


def natural_silences(loud: Sequence[float], after: float, window_s: float = WINDOW_S,
                     frame_s: float = FRAME_S) -> list[float]:
    """The longest silence in each whole `window_s` stretch of the reply's audio from `after` to its last loud
    frame (each silence cut to its stretch): how silent a stretch of the reply is with nobody speaking over it."""
    if not loud:
        return []
    end = loud[-1] + frame_s
    runs = silences(loud, end, frame_s)
    out = []
    start = after
    while start + window_s <= end:
        stop = start + window_s
        out.append(max((min(b, stop) - max(a, start) for a, b in runs if a < stop and b > start), default=0.0))
        start = stop
    return out


def pause_estimate(raw_s: float, natural_s: float) -> float:
    return max(0.0, raw_s - natural_s)


def percentiles(values: Sequence[float]) -> dict[str, float | int | None]:
    """p50 and p95 (nearest rank), and n."""
    if not values:
        return {"p50": None, "p95": None, "n": 0}
    ordered = sorted(values)
    rank = max(0, min(len(ordered) - 1, -(-95 * len(ordered) // 100) - 1))
    return {"p50": round(statistics.median(ordered), 3), "p95": round(ordered[rank], 3), "n": len(ordered)}


def reply_pause_totals(metrics_text: str) -> dict[str, tuple[float, float]] | None:
    """gateway_reply_pause_seconds' (sum, count) by outcome, from a /metrics page; None where it has none."""
    from prometheus_client.parser import text_string_to_metric_families

    totals: dict[str, list[float]] | None = None
    for family in text_string_to_metric_families(metrics_text):
        if family.name != "gateway_reply_pause_seconds":
            continue
        totals = {}
        for sample in family.samples:
            outcome = sample.labels.get("outcome", "")
            slot = totals.setdefault(outcome, [0.0, 0.0])
            if sample.name.endswith("_sum"):
                slot[0] = sample.value
            elif sample.name.endswith("_count"):
                slot[1] = sample.value
    return None if totals is None else {k: (v[0], v[1]) for k, v in totals.items()}


def pause_between(before: dict[str, tuple[float, float]] | None,
                  after: dict[str, tuple[float, float]] | None) -> dict[str, Any] | None:
    """The holds observed between two readings: {outcome: mean seconds, ..., "holds": how many}; None if the
    gateway has no such metric, {} if it held nothing."""
    if before is None or after is None:
        return None
    out: dict[str, Any] = {}
    for outcome, (total, count) in after.items():
        old_total, old_count = before.get(outcome, (0.0, 0.0))
        if count > old_count:
            out[outcome] = round((total - old_total) / (count - old_count), 3)
            out["holds"] = out.get("holds", 0) + int(count - old_count)
    return out


def k_of_n(trials: Sequence[dict[str, Any]], test: Any) -> str:
    done = [t for t in trials if "error" not in t]
    return f"{sum(bool(test(t)) for t in done)} of {len(done)}"


def summarize(trials: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """One detector's (and load's) rows from its trials; adds `natural_silence_s` and `audio_pause_s` to the
    backchannel trials that were not cut."""
    backchannels = [t for t in trials["backchannel"] if "error" not in t]
    natural = [s for t in backchannels for s in t.get("natural_silences_s", [])]
    natural_s = round(statistics.median(natural), 3) if natural else 0.0
    kept = [t for t in backchannels if t["outcome"] != "cut" and t.get("raw_silence_s") is not None]
    for trial in kept:
        trial["audio_pause_s"] = round(pause_estimate(trial["raw_silence_s"], natural_s), 3)
    metric = [t["metric_pause_s"]["resumed"] for t in backchannels
              if isinstance(t.get("metric_pause_s"), dict) and "resumed" in t["metric_pause_s"]]
    outcomes: dict[str, int] = {}
    for trial in backchannels:
        outcomes[trial["outcome"]] = outcomes.get(trial["outcome"], 0) + 1
    return {
        "backchannels_cut_the_reply": k_of_n(trials["backchannel"], lambda t: t["outcome"] == "cut"),
        "backchannels_played_on": k_of_n(trials["backchannel"], lambda t: t["outcome"] == "played_on"),
        "backchannel_outcomes": outcomes,
        "interruptions_cut_the_reply": k_of_n(trials["interruption"], lambda t: t["outcome"] == "cut"),
        "pauses_kept_one_turn": k_of_n(trials["paused"], lambda t: t["turns"] == 1),
        "pauses_ended_early": k_of_n(trials["paused"], lambda t: t["turns"] >= 2),
        "backchannel_pause_s": {
            "audio": percentiles([t["audio_pause_s"] for t in kept]),
            "raw_silence": percentiles([t["raw_silence_s"] for t in kept]),
            "natural_silence_s": natural_s,
            "natural_stretches": len(natural),
            "metric": percentiles(metric) if any(t.get("metric_pause_s") is not None for t in backchannels) else None,
        },
        "errors": sum("error" in t for kinds in trials.values() for t in kinds),
    }


def cpu_ticks() -> tuple[int, int] | None:
    """(busy, total) jiffies of all cores since boot, from /proc/stat: what everyone on the machine used."""
    try:
        values = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    except (OSError, ValueError, IndexError):
        return None
    idle = values[3] + (values[4] if len(values) > 4 else 0)  # idle + iowait
    return sum(values) - idle, sum(values)


def busy_share(before: tuple[int, int] | None, after: tuple[int, int] | None) -> float | None:
    """The machine's busy share (0..1, all cores) between two cpu_ticks()."""
    if before is None or after is None or after[1] <= before[1]:
        return None
    return round((after[0] - before[0]) / (after[1] - before[1]), 3)


def cpu_info() -> dict[str, Any]:
    """/proc/cpuinfo's model name and lscpu's family and model, the cores this process may use, the load."""
    info: dict[str, Any] = {"cores": len(os.sched_getaffinity(0))}
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                info["model_name"] = line.split(":", 1)[1].strip()
                break
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
        fields = {k.strip(): v.strip() for k, _, v in (line.partition(":") for line in out.splitlines())}
        info.update({"lscpu_model_name": fields.get("Model name"), "family": fields.get("CPU family"),
                     "model": fields.get("Model"), "stepping": fields.get("Stepping")})
    with contextlib.suppress(OSError):
        info["loadavg"] = Path("/proc/loadavg").read_text().split()[:3]
    return info


# ---- the measurement ----

@dataclass
class Spoken:
    kind: str
    voice: str
    text: str
    pcm: Any  # 48 kHz int16
    speech: tuple[int, int]  # its first speech sample, and its last + 1


def clips(voices: Sequence[EspeakSpeaker] = VOICES) -> list[Spoken]:
    """Each text once, the voices taking turns."""
    import numpy as np

    out = []
    texts = [("backchannel", t) for t in BACKCHANNELS] + [("interruption", t) for t in INTERRUPTIONS]
    for i, (kind, text) in enumerate(texts):
        voice = voices[i % len(voices)]
        clip = voice.say(text, RATE)
        out.append(Spoken(kind, voice.name, text, clip.pcm, (clip.onset, clip.end)))
    for i, (head, tail) in enumerate(PAUSED):
        voice = voices[i % len(voices)]
        first, second = voice.say(head, RATE), voice.say(tail, RATE)
        pcm = np.concatenate([first.pcm[:first.end], np.zeros(int(MID_PAUSE_S * RATE), np.int16),
                              second.pcm[second.onset:second.end], np.zeros(RATE // 10, np.int16)])
        out.append(Spoken("paused", voice.name, f"{head} [{int(MID_PAUSE_S * 1000)} ms] {tail}", pcm,
                          (first.onset, pcm.size - RATE // 10)))
    return out


@dataclass
class Call:
    """A call and what came on it: events and loud frames, with their perf_counter arrival times."""

    client: Any  # gateway.bench.webrtc.RealtimeCallClient
    events: list[dict[str, Any]] = field(default_factory=list)  # each with "_at"
    loud: list[float] = field(default_factory=list)
    pump: asyncio.Task[None] | None = None

    @classmethod
    async def open(cls, url: str, http: Any, detector: str, model: str) -> Call:
        from gateway.bench.clients import Target
        from gateway.bench.webrtc import RealtimeCallClient

        target = Target(url, model, api_key=None, max_tokens=REPLY_TOKENS, seed=None)
        call = cls(await RealtimeCallClient.open(target, http, None, None, timeout_s=30))
        call.pump = asyncio.create_task(call._pump())
        try:
            await call.send({"type": "session.update", "session": {"type": "realtime", "temperature": 0, "audio": {
                "input": {"turn_detection": TURN_DETECTION[detector]}}}})
            updated = await call.wait("session.updated", 15)
            if updated is None:
                raise RuntimeError(f"no session.updated: {[e['type'] for e in call.events][-5:]}")
            kind = updated["session"]["audio"]["input"]["turn_detection"]["type"]
            if kind != detector:
                raise RuntimeError(f"the session's turn detection is {kind}, not {detector}")
        except BaseException:
            await call.close()
            raise
        return call

    async def _pump(self) -> None:
        from gateway.bench.voice import AudioIn

        with contextlib.suppress(Exception):
            while True:
                at, item = await self.client.next(time.perf_counter() + 3600)
                if isinstance(item, AudioIn):
                    self.loud.append(at)
                elif isinstance(item, dict):
                    self.events.append({**item, "_at": at})

    async def send(self, event: dict[str, Any]) -> None:
        await self.client.send(event)

    async def wait(self, kind: str, timeout: float, since: int = 0) -> dict[str, Any] | None:
        deadline = time.perf_counter() + timeout
        while True:
            found = next((e for e in self.events[since:] if e["type"] == kind), None)
            if found is not None or time.perf_counter() >= deadline:
                return found
            await asyncio.sleep(0.02)

    async def say(self, spoken: Spoken, timeout: float = 5.0) -> Any:
        """Speak `spoken` now; its Utterance once its first speech left the microphone."""
        utterance = self.client.say(spoken.pcm, spoken.speech)
        deadline = time.perf_counter() + timeout
        while utterance.onset is None:
            if time.perf_counter() > deadline:
                raise TimeoutError("the microphone sent nothing")
            await asyncio.sleep(0.005)
        return utterance

    async def close(self) -> None:
        await self.client.close()
        if self.pump is not None:
            self.pump.cancel()
            await asyncio.gather(self.pump, return_exceptions=True)


def event_log(events: Sequence[dict[str, Any]], origin: float, limit: int = 40) -> list[list[Any]]:
    """[seconds from `origin`, type, a detail] for each event but the deltas."""
    out: list[list[Any]] = []
    for event in events:
        kind = event["type"]
        if kind.endswith(".delta"):
            continue
        detail = event.get("transcript") if kind.endswith("transcription.completed") else \
            (event.get("response") or {}).get("status") if kind == "response.done" else None
        out.append([round(event["_at"] - origin, 3), kind, *([detail] if detail is not None else [])])
    return out[:limit]


async def metric_totals(url: str, http: Any) -> dict[str, tuple[float, float]] | None:
    try:
        response = await http.get(f"{url}/metrics")
    except Exception:  # no metrics: the audio estimate stands alone
        return None
    return reply_pause_totals(response.text) if response.status_code == 200 else None


async def over_reply(url: str, http: Any, detector: str, spoken: Spoken, model: str) -> dict[str, Any]:
    """One clip over a long reply: what it did to the reply, and how long the reply's audio went silent."""
    call = await Call.open(url, http, detector, model)
    try:
        await call.send({"type": "conversation.item.create", "item": {"type": "message", "role": "user", "content": [
            {"type": "input_text", "text": REPLY_PROMPT}]}})
        asked = time.perf_counter()
        await call.send({"type": "response.create"})
        started = await call.wait("output_audio_buffer.started", 60)
        created = await call.wait("response.created", 1)
        if started is None or created is None:
            return {"error": f"the reply never started: {[e['type'] for e in call.events][-8:]}"}
        reply_id = created["response"]["id"]
        await asyncio.sleep(1.0)
        before = await metric_totals(url, http)
        mark = len(call.events)
        utterance = await call.say(spoken)
        onset = utterance.onset
        cut_at = None
        while time.perf_counter() < onset + RECORD_S:
            if cut_at is None and reply_cut(call.events[mark:], reply_id):
                cut_at = time.perf_counter()
            if cut_at is not None and time.perf_counter() > cut_at + CUT_TAIL_S:
                break
            await asyncio.sleep(0.05)
        until = time.perf_counter()
        after = await metric_totals(url, http)
        later = call.events[mark:]
        outcome = classify(later, reply_id)
        verdict = next((e for e in later if e["type"] in (*CUT_EVENTS, "conversation.item.deleted")
                        or (e["type"] == "response.done" and e["response"]["status"] == "cancelled")), None)
        result: dict[str, Any] = {
            "outcome": outcome,
            "reply_audio_after_s": round(started["_at"] - asked, 3),
            "verdict_after_onset_s": round(verdict["_at"] - onset, 3) if verdict is not None else None,
            # None where the reply was cut before the clip's speech had all been sent
            "verdict_after_speech_end_s": round(verdict["_at"] - utterance.speech_end, 3)
            if verdict is not None and utterance.speech_end is not None else None,
            "transcript": next((e.get("transcript") for e in later
                                if e["type"].endswith("input_audio_transcription.completed")), None),
            "metric_pause_s": pause_between(before, after),
            "mic_max_lag_ms": round(call.client.mic.max_lag_ms, 1),
        }
        if outcome != "cut":
            loud = [at for at in call.loud if at <= until]
            hold = hold_silence(loud, onset, until)
            if hold is not None:
                length, end, censored = hold
                result.update(raw_silence_s=round(length, 3), silence_outlasted_recording=censored,
                              natural_silences_s=[round(s, 3) for s in natural_silences(loud, end)])
        result["events"] = event_log(later, onset)
        return result
    finally:
        await call.close()


async def paused(url: str, http: Any, detector: str, spoken: Spoken, model: str) -> dict[str, Any]:
    """A sentence with a mid-thought pause, to an idle session: how many user turns it made."""
    call = await Call.open(url, http, detector, model)
    try:
        mark = len(call.events)
        utterance = await call.say(spoken)
        while utterance.speech_end is None:
            await asyncio.sleep(0.02)
        end = utterance.speech_end
        final = None
        while time.perf_counter() < end + 10.0:  # a turn committed after the speech ended, then 1.5 s for stragglers
            if final is None:
                final = next((e for e in call.events[mark:]
                              if e["type"] == "input_audio_buffer.committed" and e["_at"] > end), None)
            elif time.perf_counter() > final["_at"] + 1.5:
                break
            await asyncio.sleep(0.05)
        later = call.events[mark:]
        commits = [e for e in later if e["type"] == "input_audio_buffer.committed"]
        return {"turns": user_turns(later), "commits_after_onset_s": [round(e["_at"] - utterance.onset, 3)
                                                                    for e in commits],
                "speech_end_after_onset_s": round(end - utterance.onset, 3),
                "transcripts": [e.get("transcript") for e in later
                                if e["type"].endswith("input_audio_transcription.completed")],
                "events": event_log(later, utterance.onset)}
    finally:
        await call.close()


async def measure(url: str, detectors: Sequence[str], spoken: Sequence[Spoken], model: str, progress: Any,
                  warmup: bool = True) -> dict[str, Any]:
    import httpx

    report: dict[str, Any] = {}
    async with httpx.AsyncClient(timeout=30) as http:
        if warmup:  # the first call's models run cold: one trial, not counted
            detector = "semantic_vad" if "semantic_vad" in detectors else detectors[0]
            try:
                trial = await over_reply(url, http, detector, spoken[0], model)
            except Exception as exc:  # a failed warm-up says so; the trials go on
                trial = {"error": f"{type(exc).__name__}: {exc}"}
            report["warmup"] = {"detector": detector, "voice": spoken[0].voice, "text": spoken[0].text, **trial}
            progress(f"warm-up ({detector} {spoken[0].text!r}): {trial.get('outcome', trial.get('error'))}")
        for detector in detectors:
            trials: dict[str, list[dict[str, Any]]] = {"backchannel": [], "interruption": [], "paused": []}
            for clip in spoken:
                began = time.perf_counter()
                try:
                    trial = await (paused if clip.kind == "paused" else over_reply)(url, http, detector, clip, model)
                except Exception as exc:  # one failed trial is reported, the rest go on
                    trial = {"error": f"{type(exc).__name__}: {exc}"}
                trials[clip.kind].append({"voice": clip.voice, "text": clip.text, **trial,
                                          "trial_s": round(time.perf_counter() - began, 1)})
                progress(f"{detector} {clip.kind} {clip.text!r}: "
                         f"{trial.get('outcome', trial.get('turns', trial.get('error')))}")
            report[detector] = {**summarize(trials), "trials": trials}
    return report


@contextlib.contextmanager
def busy(count: int, seconds: float) -> Iterator[list[int]]:
    """`count` busy processes at nice 19 beside the gateway (as a build would be), each ending by itself after
    `seconds`, and killed on the way out."""
    spin = f"import time\nend = time.monotonic() + {seconds}\nwhile time.monotonic() < end:\n    pass\n"
    procs = [subprocess.Popen(["nice", "-n", "19", sys.executable, "-c", spin]) for _ in range(count)]
    try:
        yield [p.pid for p in procs]
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


class GatewayAt(GatewayProcess):
    """The gateway started in another checkout (`cwd`), with this interpreter: `python -m gateway` there imports
    that checkout's packages, which come first on sys.path."""

    def __init__(self, log_path: Path, cwd: Path, **kwargs: Any) -> None:
        super().__init__(log_path, **kwargs)
        self.cwd = cwd
        self.env = {**self.env, "PYTHONPATH": os.pathsep.join(
            [str(cwd), *filter(None, [os.environ.get("PYTHONPATH")])])}

    def start(self) -> GatewayAt:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(self.command, cwd=self.cwd, env=self.env, stdout=log,
                                            stderr=subprocess.STDOUT)
        return self

    def imports(self) -> dict[str, Any]:
        """Where this interpreter, started as the gateway is, imports the gateway's packages from; the commit."""
        probe = "import json, gateway, inference, media; print(json.dumps({m.__name__: m.__file__ " \
                "for m in (gateway, inference, media)}))"
        out: dict[str, Any] = {"python": sys.executable, "cwd": str(self.cwd)}
        with contextlib.suppress(subprocess.SubprocessError, ValueError):
            done = subprocess.run([sys.executable, "-c", probe], cwd=self.cwd, env=self.env, capture_output=True,
                                  text=True, timeout=60)
            out["modules"] = json.loads(done.stdout.strip().splitlines()[-1]) if done.returncode == 0 \
                else done.stderr[-500:]
        with contextlib.suppress(subprocess.SubprocessError, OSError):
            out["commit"] = subprocess.run(["git", "-C", str(self.cwd), "rev-parse", "HEAD"], capture_output=True,
                                           text=True, timeout=10).stdout.strip()
            changed = subprocess.run(["git", "-C", str(self.cwd), "status", "--porcelain", "--untracked-files=no"],
                                     capture_output=True, text=True, timeout=10).stdout.splitlines()
            out["uncommitted_changes"] = [line[3:] for line in changed]
        return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gateway-url", help="measure this running gateway (it must offer an ICE address this "
                                              "host reaches, e.g. --ice-host-addresses 127.0.0.1)")
    parser.add_argument("--cwd", type=Path, default=Path.cwd(), help="the checkout whose gateway to start")
    parser.add_argument("--port", type=int, help="the started gateway's port (default: a free one)")
    parser.add_argument("--ready-timeout", type=float, default=300)
    parser.add_argument("--detectors", default=",".join(DETECTORS))
    parser.add_argument("--load", default="0", help="busy processes beside it, one setting or several: 0,2")
    parser.add_argument("--load-max-s", type=float, default=900, help="each busy process ends by itself after this")
    parser.add_argument("--per-kind", type=int, help="only the first N clips of each kind (a quick look)")
    parser.add_argument("--no-warmup", action="store_true", help="count the first call too")
    parser.add_argument("--model", default=MODEL)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    detectors = [d for d in args.detectors.split(",") if d]
    if unknown := set(detectors) - set(TURN_DETECTION):
        parser.error(f"unknown detector(s): {sorted(unknown)}")
    loads = [int(n) for n in args.load.split(",") if n]

    def progress(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    began = time.perf_counter()
    spoken = clips()
    if args.per_kind is not None:
        spoken = [c for c in spoken if [d.kind for d in spoken[:spoken.index(c)]].count(c.kind) < args.per_kind]
    report: dict[str, Any] = {"cpu": cpu_info(), "voices": [v.name for v in VOICES], "window_s": WINDOW_S,
                              "record_s": RECORD_S}
    with contextlib.ExitStack() as stack:
        if args.gateway_url:
            url = args.gateway_url.rstrip("/")
            report["gateway"] = {"url": url, "healthz": get_json(f"{url}/healthz")[0]}
        else:
            logs = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="overlap-")))
            log = Path(tempfile.gettempdir()) / f"overlap-gateway-{os.getpid()}.log"
            gateway = GatewayAt(log, args.cwd.resolve(), port=args.port or free_port(), data_dir=logs / "data")
            report["gateway"] = {**gateway.imports(), "log": str(log)}
            progress(f"starting the gateway in {gateway.cwd} on {gateway.url} (log: {log})")
            stack.callback(gateway.stop)
            ready = time.perf_counter()
            gateway.start().wait_ready(args.ready_timeout)
            report["gateway"].update(url=gateway.url, ready_s=round(time.perf_counter() - ready, 1))
            url = gateway.url
        runs = []
        for i, load in enumerate(loads):
            with busy(load, args.load_max_s):
                progress(f"load {load}: {len(detectors)} detector(s), {len(spoken)} trials each")
                cpu_before, ticks = cpu_info().get("loadavg"), cpu_ticks()
                measured = asyncio.run(measure(url, detectors, spoken, args.model, progress,
                                               warmup=i == 0 and not args.no_warmup))
            # the machine's busy share over the run: this gateway and client, the load, and whoever else runs here
            runs.append({"load": load, "loadavg_before": cpu_before, "loadavg_after": cpu_info().get("loadavg"),
                         "machine_busy_share": busy_share(ticks, cpu_ticks()), **measured})
        report["runs"] = runs
    report["table"] = [
        {"load": run["load"], "detector": d, **{k: v for k, v in run[d].items() if k != "trials"}}
        for run in runs for d in detectors]
    report["run_s"] = round(time.perf_counter() - began, 1)
    text = json.dumps(report, indent=1)
    print(text)
    if args.out is not None:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
