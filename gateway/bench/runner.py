"""`gateway bench`: sessions started at a ramp, each running its turns, a live display, and the report.

Its own overhead is measured while it runs (event-loop lag, CPU) and reported, so that a run whose
client was the bottleneck says so.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import random
import resource
import signal
import time
from collections.abc import Coroutine
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any, TypeVar

import httpx
import websockets
from rich.console import Console
from rich.live import Live

from gateway.bench.audio import spoken_questions, wav_questions
from gateway.bench.carriers import CARRIERS, CarrierStreamClient
from gateway.bench.clients import BenchError, ChatClient, RealtimeTextClient, Target, probe_clock
from gateway.bench.ladder import (
    barge_in_stop,
    build_ladder,
    host_cpu,
    per_turn,
    print_ladder,
    read_server_counters,
    write_ladder,
)
from gateway.bench.live import LiveVoiceClient
from gateway.bench.phone import RATE as PHONE_RATE
from gateway.bench.report import build_report, compare, print_table, write_outputs
from gateway.bench.sip import SipCallClient, SipPhone, host_port
from gateway.bench.stats import TurnRecord, metric_values, percentile, summarize
from gateway.bench.voice import VOICE_RATE, RealtimeVoiceClient, SpokenClient
from gateway.bench.webrtc import RTC_RATE, RealtimeCallClient

QUESTIONS = (
    "What is the capital of France?",
    "Name three colours.",
    "What is two plus two?",
    "Say hello in Spanish.",
    "What is the tallest mountain on Earth?",
    "How many days are in a week?",
)
T = TypeVar("T")
LAG_INTERVAL_S = 0.05
GRACE_S = 5.0  # after the first Ctrl-C, how long the turns under way get to finish before they are cancelled
# What a malformed SSE line or event raises in a client: the turn fails with bad_response.
BAD_RESPONSE = (ValueError, KeyError, IndexError, TypeError, AttributeError)


@dataclass
class BenchConfig:
    url: str
    mode: str  # chat | text | voice | webrtc | twilio | telnyx | plivo | sip | live
    model: str
    api_key: str | None = None
    sessions: int = 4
    turns: int | None = 3  # per session; None: until --duration ends
    ramp: float = 0.0  # sessions started per second (0: all at once)
    duration: float = 0.0  # stop starting turns after this many seconds (0: no limit)
    think_time: float = 0.0  # seconds between a session's turns, drawn uniformly in [0, think_time]
    prompts: tuple[str, ...] = QUESTIONS
    system_prompt_tokens: int = 0
    max_tokens: int = 64
    seed: int | None = None  # None: the workload is drawn with seed 0, and no seed goes to the server
    out: Path = Path("bench-out")
    audio: Path | None = None  # spoken modes: a folder of WAV questions (default: the text ones, spoken by Piper)
    barge_in: bool = False  # spoken modes: speak the next question over each answer
    barge_in_after_ms: int = 300  # ... this long after the answer's first audio
    listen: bool = False  # voice: a session's next turn waits until its answer's audio would have played
    sip: str | None = None  # sip: the gateway's --sip-listen (HOST:PORT; None: --url's host, port 5060)
    webhook_listen: str = "127.0.0.1:8787"  # sip: where the bench takes the gateway's webhooks
    webhook_secret: str | None = None  # sip: the gateway's --webhook-secret

    @property
    def spoken(self) -> bool:
        return self.mode in ("voice", "webrtc", *CARRIERS, "sip", "live")

    def public(self) -> dict[str, Any]:
        """The configuration as report.json records it (never the key)."""
        return {"url": self.url, "mode": self.mode, "model": self.model, "sessions": self.sessions, "turns": self.turns,
                "ramp": self.ramp, "duration": self.duration, "think_time": self.think_time,
                "prompts": len(self.prompts), "system_prompt_tokens": self.system_prompt_tokens,
                "max_tokens": self.max_tokens, "seed": self.seed, "api_key": "set" if self.api_key else None,
                "audio": str(self.audio) if self.audio else None, "barge_in": self.barge_in,
                "barge_in_after_ms": self.barge_in_after_ms if self.barge_in else None, "listen": self.listen,
                **({"sip": self.sip_address(), "webhook_listen": self.webhook_listen} if self.mode == "sip" else {})}

    def sip_address(self) -> str:
        return self.sip or f"{httpx.URL(self.url).host}:5060"

    def phone(self) -> SipPhone | None:
        """--mode sip's user agent and application for the run (not started)."""
        if self.mode != "sip":
            return None
        if not self.webhook_secret:
            raise BenchError("--mode sip needs --webhook-secret: the gateway's, to check its webhooks")
        return SipPhone(host_port(self.sip_address(), "--sip"), host_port(self.webhook_listen, "--webhook-listen"),
                        self.webhook_secret)


def system_prompt(tokens: int) -> str | None:
    """About `tokens` tokens shared by every session (one short word is about one token)."""
    if tokens <= 0:
        return None
    words = ("alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel")
    return "You are a helpful assistant. Reference words: " + " ".join(words[i % len(words)] for i in range(tokens))


class Interrupt:
    """Ctrl-C. The first stops starting sessions and turns, and gives the turns under way GRACE_S to finish;
    the second, or the end of the grace, cancels them. The report of what finished is written either way."""

    def __init__(self) -> None:
        self.stop = asyncio.Event()
        self.cancel = asyncio.Event()

    def press(self) -> None:
        if self.stop.is_set():
            self.cancel.set()
            return
        self.stop.set()
        asyncio.get_running_loop().call_later(GRACE_S, self.cancel.set)


class SessionPlan:
    """A session's workload: the order of its questions and its think times, drawn from its own generator,
    seeded with the run's seed and the session's index; so a seeded run draws the same whatever the timing
    and whatever the other sessions draw."""

    def __init__(self, seed: int, index: int, questions: int) -> None:
        self._rng = random.Random(f"{seed}/{index}")
        self._order = self._rng.sample(range(questions), questions)

    def question(self, turn: int) -> int:
        """The index of the question of `turn`: all of them in the session's order, then again."""
        return self._order[turn % len(self._order)]

    def think_time(self, most: float) -> float:
        return self._rng.uniform(0, most) if most > 0 else 0.0


@dataclass
class Progress:
    spoken: bool = False  # voice and webrtc: the live line shows voice-to-voice too
    started: float = field(default_factory=time.perf_counter)
    active: int = 0
    turns: list[TurnRecord] = field(default_factory=list)
    concurrency: list[tuple[float, int]] = field(default_factory=list)
    lags_ms: list[float] = field(default_factory=list)
    links: list[dict[str, Any]] = field(default_factory=list)  # each spoken session's downlink, as its transport saw it

    def elapsed(self) -> float:
        return time.perf_counter() - self.started

    def over(self, duration: float) -> bool:
        """Past --duration (0: no limit)."""
        return duration > 0 and self.elapsed() >= duration

    def session_delta(self, change: int) -> None:
        self.active += change
        self.concurrency.append((round(self.elapsed(), 3), self.active))

    def line(self) -> str:
        errors = sum(1 for turn in self.turns if turn.error is not None)
        parts = [f"{self.elapsed():6.1f} s  sessions active {self.active}  turns done {len(self.turns)}  errors {errors}",
                 _running("TTFT", metric_values(self.turns, "ttft_ms"))]
        if self.spoken:
            parts.append(_running("voice-to-voice", metric_values(self.turns, "voice_to_voice_ms")))
        return "  ".join(parts)


def _running(label: str, values: list[float]) -> str:
    if not values:
        return f"{label} -"
    return f"{label} p50 {percentile(values, 50):.0f} ms, p95 {percentile(values, 95):.0f} ms"


Client = ChatClient | RealtimeTextClient | SpokenClient


async def _open(config: BenchConfig, target: Target, http: httpx.AsyncClient, phone: SipPhone | None) -> Client:
    prompt = system_prompt(config.system_prompt_tokens)
    barge_in_after_s = config.barge_in_after_ms / 1000 if config.barge_in else None
    if config.mode == "chat":
        return ChatClient(target, http, prompt)
    if config.mode == "voice":
        return await RealtimeVoiceClient.open(target, prompt, barge_in_after_s, listens=config.listen)
    if config.mode == "webrtc":
        return await RealtimeCallClient.open(target, http, prompt, barge_in_after_s)
    if config.mode in CARRIERS:
        return await CarrierStreamClient.open(target, config.mode, prompt, barge_in_after_s)
    if config.mode == "sip":
        assert phone is not None
        return await SipCallClient.open(target, phone, http, prompt, barge_in_after_s)
    if config.mode == "live":
        return await LiveVoiceClient.open(target, prompt, barge_in_after_s)
    return await RealtimeTextClient.open(target, prompt)


async def _session(index: int, config: BenchConfig, target: Target, http: httpx.AsyncClient, phone: SipPhone | None,
                   progress: Progress, stop: asyncio.Event, questions: list[Any]) -> None:
    plan = SessionPlan(config.seed if config.seed is not None else 0, index, len(questions))
    opened_at = round(progress.elapsed(), 3)
    try:
        client = await _open(config, target, http, phone)
    except BenchError as exc:  # refused after the preflight (e.g. the key's session cap): this session fails alone
        progress.turns.append(TurnRecord(session=index, turn=0, started_at=opened_at, error=exc.code))
        return
    progress.session_delta(+1)
    try:
        for turn in range(config.turns) if config.turns is not None else itertools.count():
            if turn and (think := plan.think_time(config.think_time)):
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), think)
            if stop.is_set() or progress.over(config.duration):
                return
            record = TurnRecord(session=index, turn=turn, started_at=round(progress.elapsed(), 3),
                                question=plan.question(turn))
            session_over = await _take_turn(client, record, questions, plan, config)
            progress.turns.append(record)
            if session_over:
                return
    finally:
        progress.session_delta(-1)
        if isinstance(client, SpokenClient) and (link := await client.link_stats()) is not None:
            progress.links.append({"session": index, **link})
        await client.close()


async def _take_turn(client: Client, record: TurnRecord, questions: list[Any], plan: SessionPlan,
                     config: BenchConfig) -> bool:
    """One turn, its result or its error in `record`; True when its session cannot go on."""
    question = questions[plan.question(record.turn)]
    try:
        if isinstance(client, SpokenClient):
            interrupter = questions[plan.question(record.turn + 1)] if config.barge_in else None
            await client.turn(record, question, interrupter)
        else:
            await client.turn(record, question)
    except httpx.HTTPError as exc:
        record.error = type(exc).__name__
    except TimeoutError:
        record.error = "timeout"
    except (BenchError, websockets.ConnectionClosed):  # the server closed this session: the run goes on
        record.error = "connection_closed"
        return True
    except BAD_RESPONSE:
        record.error = "bad_response"
        # A chat turn is a request of its own; a Realtime session's events are out of step after one.
        return not isinstance(client, ChatClient)
    return False


async def _measure_lag(progress: Progress) -> None:
    """How late the loop wakes a task that asked to sleep LAG_INTERVAL_S: the tool's own delay."""
    while True:
        before = time.perf_counter()
        await asyncio.sleep(LAG_INTERVAL_S)
        progress.lags_ms.append(max(0.0, (time.perf_counter() - before - LAG_INTERVAL_S) * 1000))


async def _preflight(config: BenchConfig, target: Target, http: httpx.AsyncClient, phone: SipPhone | None) -> None:
    """One request before the run (it also loads a lazy server's model): an unreachable server, a refused key
    or an unknown model is one line, not N tracebacks."""
    if config.mode in ("text", "voice"):
        client = await RealtimeTextClient.open(target, None)
        await client.close()
        return
    if config.mode == "webrtc":
        call = await RealtimeCallClient.open(target, http, None, None)
        await call.close()
        return
    if config.mode in CARRIERS:
        stream = await CarrierStreamClient.open(target, config.mode, None, None)
        await stream.close()
        return
    if config.mode == "sip":
        assert phone is not None
        sip_call = await SipCallClient.open(target, phone, http, None, None)
        await sip_call.close()
        return
    if config.mode == "live":
        live = await LiveVoiceClient.open(target, None, None)
        await live.close()
        return
    body = {"model": target.model, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1}
    try:
        response = await http.post(f"{target.url}/v1/chat/completions", json=body, headers=target.headers)
    except httpx.HTTPError as exc:
        raise BenchError(f"cannot reach {target.url}: {exc}") from None
    if response.status_code in (401, 403):
        raise BenchError(f"{target.url} refused the key ({response.status_code})")
    if response.status_code != 200:
        raise BenchError(f"{target.url}/v1/chat/completions answered {response.status_code}: "
                         f"{response.text[:200]!r}")
    try:
        response.json()["choices"][0]
    except (ValueError, KeyError, IndexError, TypeError):
        raise BenchError(f"{target.url}/v1/chat/completions did not answer a chat completion") from None


async def _prepare(config: BenchConfig, target: Target, http: httpx.AsyncClient, phone: SipPhone | None
                   ) -> tuple[Target, list[Any]]:
    """The questions, the preflight and the clock. WAV files are read first (a bad one is said before any
    request); Piper speaks the questions last, once the server has said yes."""
    rate = RTC_RATE if config.mode == "webrtc" else PHONE_RATE if config.mode in (*CARRIERS, "sip") else VOICE_RATE
    questions: list[Any] = list(config.prompts)
    if config.audio is not None:
        questions = await asyncio.to_thread(wav_questions, config.audio, rate)
    await _preflight(config, target, http, phone)
    if config.mode != "chat":  # chat has no latency marks to put on the client's clock
        target = dataclasses.replace(target, clock=await probe_clock(http, target))
    if config.spoken and config.audio is None:
        questions = await asyncio.to_thread(spoken_questions, config.prompts, rate)
    return target, questions


async def _unless_stopped(stop: asyncio.Event, work: Coroutine[Any, Any, T]) -> T | None:
    """`work`'s result, or None when Ctrl-C comes first (`work` is cancelled then)."""
    task = asyncio.create_task(work)
    stopped = asyncio.create_task(stop.wait())
    try:
        await asyncio.wait({task, stopped}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopped.cancel()
    if task.done():
        return task.result()
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    return None


async def _drive(config: BenchConfig, target: Target, http: httpx.AsyncClient, phone: SipPhone | None,
                 questions: list[Any], progress: Progress, interrupt: Interrupt, console: Console) -> None:
    """The sessions, started at the ramp, until they are done or Ctrl-C cancels them."""
    lag = asyncio.create_task(_measure_lag(progress))
    sessions: list[asyncio.Task[None]] = []
    try:
        with Live(progress.line(), console=console, refresh_per_second=4, transient=True) as live:
            for index in range(config.sessions):
                if interrupt.stop.is_set() or progress.over(config.duration):
                    break
                sessions.append(asyncio.create_task(
                    _session(index, config, target, http, phone, progress, interrupt.stop, questions)))
                if config.ramp > 0 and index + 1 < config.sessions:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(interrupt.stop.wait(), 1 / config.ramp)
                live.update(progress.line())
            pending = set(sessions)
            while pending and not interrupt.cancel.is_set():
                done, pending = await asyncio.wait(pending, timeout=0.25)
                for task in done:
                    if not task.cancelled() and (error := task.exception()) is not None:
                        raise error  # a bug: a session records what the server did, and never raises
                live.update(progress.line())
    finally:
        for task in (*sessions, lag):
            task.cancel()
        await asyncio.gather(*sessions, lag, return_exceptions=True)


async def run(config: BenchConfig, console: Console) -> dict[str, Any]:
    target = Target(config.url.rstrip("/"), config.model, config.api_key, config.max_tokens, config.seed)
    interrupt = Interrupt()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGINT, interrupt.press)
    try:
        return await _run(config, target, interrupt, console)
    finally:
        loop.remove_signal_handler(signal.SIGINT)


async def run_ladder(config: BenchConfig, levels: list[int], console: Console) -> dict[str, Any]:
    """The same workload at each session count in turn, each level's report in `sessions-N/` of --out, and the
    ladder's (ladder.json, ladder.png) in --out. Ctrl-C ends the level under way as a run's, and the ladder there."""
    reports = []
    for sessions in levels:
        console.print(f"ladder: {sessions} session{'s' if sessions > 1 else ''}")
        report = await run(dataclasses.replace(config, sessions=sessions, out=config.out / f"sessions-{sessions}"),
                           console)
        reports.append(report)
        if report["interrupted"]:
            break
    ladder = build_ladder(reports, host_cpu())
    print_ladder(ladder, console)
    write_ladder(config.out, ladder)
    console.print(f"ladder: {config.out / 'ladder.json'}, {config.out / 'ladder.png'}")
    return ladder


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def _run(config: BenchConfig, target: Target, interrupt: Interrupt, console: Console) -> dict[str, Any]:
    limits = httpx.Limits(max_connections=config.sessions + 1, max_keepalive_connections=config.sessions + 1)
    phone = config.phone()
    async with httpx.AsyncClient(timeout=httpx.Timeout(120, connect=10), limits=limits) as http:
        if phone is not None:
            await phone.start()
        try:
            prepared = await _unless_stopped(interrupt.stop, _prepare(config, target, http, phone))
            cpu_before = _cpu_s()  # the run's own CPU, not the questions' synthesis
            progress = Progress(spoken=config.spoken)
            server_before = server_after = None
            if prepared is not None:
                target, questions = prepared
                server_before = await read_server_counters(http, target.url, target.headers)
                await _drive(config, target, http, phone, questions, progress, interrupt, console)
                server_after = await read_server_counters(http, target.url, target.headers)
        finally:
            if phone is not None:
                await phone.stop()
    elapsed = progress.elapsed()
    overhead = {"loop_lag_ms": summarize(progress.lags_ms),
                "cpu_percent": round(100 * (_cpu_s() - cpu_before) / max(elapsed, 1e-9), 1)}
    turns_ok = sum(1 for turn in progress.turns if turn.error is None)
    report = build_report(progress.turns, config=config.public(), version=_version(), duration_s=elapsed,
                          overhead=overhead, interrupted=interrupt.stop.is_set(), clock=target.clock,
                          core_seconds_per_turn=per_turn(server_before, server_after, turns_ok),
                          barge_in_stop=barge_in_stop(server_before, server_after), links=progress.links)
    write_outputs(config.out, report, progress.turns, progress.concurrency)
    print_table(report, console)
    console.print(f"report: {config.out / 'report.json'}, {config.out / 'turns.csv'}, {config.out / 'report.html'}")
    return report


def _version() -> str:
    try:
        return version("realtime-gateway")
    except PackageNotFoundError:
        return "unknown"


def run_compare(paths: list[Path], out: Path | None, console: Console) -> None:
    compare(paths, console, out)
