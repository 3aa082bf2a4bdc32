"""`gateway bench`: sessions started at a ramp, each running its turns, a live display, and the report.

Its own overhead is measured while it runs (event-loop lag, CPU) and reported, so that a run whose
client was the bottleneck says so.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import random
import resource
import signal
import time
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import httpx
import websockets
from rich.console import Console
from rich.live import Live

from gateway.bench.audio import spoken_questions, wav_questions
from gateway.bench.clients import BenchError, ChatClient, RealtimeTextClient, Target, probe_clock
from gateway.bench.report import build_report, compare, print_table, write_outputs
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
LAG_INTERVAL_S = 0.05


@dataclass
class BenchConfig:
    url: str
    mode: str  # chat | text | voice | webrtc
    model: str
    api_key: str | None = None
    sessions: int = 4
    turns: int = 3
    ramp: float = 0.0  # sessions started per second (0: all at once)
    duration: float = 0.0  # stop starting turns after this many seconds (0: no limit)
    think_time: float = 0.0  # seconds between a session's turns, drawn uniformly in [0, think_time]
    prompts: tuple[str, ...] = QUESTIONS
    system_prompt_tokens: int = 0
    max_tokens: int = 64
    seed: int | None = None
    out: Path = Path("bench-out")
    audio: Path | None = None  # spoken modes: a folder of WAV questions (default: the text ones, spoken by Piper)
    barge_in: bool = False  # spoken modes: speak the next question over each answer
    barge_in_after_ms: int = 300  # ... this long after the answer's first audio

    @property
    def spoken(self) -> bool:
        return self.mode in ("voice", "webrtc")

    def public(self) -> dict[str, Any]:
        """The configuration as report.json records it (never the key)."""
        return {"url": self.url, "mode": self.mode, "model": self.model, "sessions": self.sessions, "turns": self.turns,
                "ramp": self.ramp, "duration": self.duration, "think_time": self.think_time,
                "prompts": len(self.prompts), "system_prompt_tokens": self.system_prompt_tokens,
                "max_tokens": self.max_tokens, "seed": self.seed, "api_key": "set" if self.api_key else None,
                "audio": str(self.audio) if self.audio else None, "barge_in": self.barge_in,
                "barge_in_after_ms": self.barge_in_after_ms if self.barge_in else None}


def system_prompt(tokens: int) -> str | None:
    """About `tokens` tokens shared by every session (one short word is about one token)."""
    if tokens <= 0:
        return None
    words = ("alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel")
    return "You are a helpful assistant. Reference words: " + " ".join(words[i % len(words)] for i in range(tokens))


@dataclass
class Progress:
    started: float = field(default_factory=time.perf_counter)
    active: int = 0
    turns: list[TurnRecord] = field(default_factory=list)
    concurrency: list[tuple[float, int]] = field(default_factory=list)
    lags_ms: list[float] = field(default_factory=list)

    def elapsed(self) -> float:
        return time.perf_counter() - self.started

    def session_delta(self, change: int) -> None:
        self.active += change
        self.concurrency.append((round(self.elapsed(), 3), self.active))

    def line(self) -> str:
        ttft = metric_values(self.turns, "ttft_ms")
        errors = sum(1 for turn in self.turns if turn.error is not None)
        running = (f"TTFT p50 {percentile(ttft, 50):.0f} ms, p95 {percentile(ttft, 95):.0f} ms" if ttft else "TTFT -")
        return (f"{self.elapsed():6.1f} s  sessions active {self.active}  turns done {len(self.turns)}  "
                f"errors {errors}  {running}")


async def _session(index: int, config: BenchConfig, target: Target, http: httpx.AsyncClient, progress: Progress,
                   stop: asyncio.Event, rng: random.Random, questions: list[Any]) -> None:
    prompt = system_prompt(config.system_prompt_tokens)
    barge_in_after_s = config.barge_in_after_ms / 1000 if config.barge_in else None
    client: ChatClient | RealtimeTextClient | SpokenClient
    if config.mode == "chat":
        client = ChatClient(target, http, prompt)
    elif config.mode == "voice":
        client = await RealtimeVoiceClient.open(target, prompt, barge_in_after_s)
    elif config.mode == "webrtc":
        client = await RealtimeCallClient.open(target, http, prompt, barge_in_after_s)
    else:
        client = await RealtimeTextClient.open(target, prompt)
    progress.session_delta(+1)
    try:
        for turn in range(config.turns):
            if stop.is_set() or (config.duration and progress.elapsed() >= config.duration):
                return
            record = TurnRecord(session=index, turn=turn, started_at=round(progress.elapsed(), 3))
            question = questions[(index + turn) % len(questions)]
            try:
                if isinstance(client, SpokenClient):
                    interrupter = questions[(index + turn + 1) % len(questions)] if config.barge_in else None
                    await client.turn(record, question, interrupter)
                else:
                    await client.turn(record, question)
            except httpx.HTTPError as exc:
                record.error = type(exc).__name__
            except TimeoutError:
                record.error = "timeout"
            except (BenchError, websockets.ConnectionClosed):  # the server closed this session: the run goes on
                record.error = "connection_closed"
                progress.turns.append(record)
                return
            progress.turns.append(record)
            if config.think_time and turn + 1 < config.turns:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), rng.uniform(0, config.think_time))
    finally:
        progress.session_delta(-1)
        await client.close()


async def _measure_lag(progress: Progress) -> None:
    """How late the loop wakes a task that asked to sleep LAG_INTERVAL_S: the tool's own delay."""
    while True:
        before = time.perf_counter()
        await asyncio.sleep(LAG_INTERVAL_S)
        progress.lags_ms.append(max(0.0, (time.perf_counter() - before - LAG_INTERVAL_S) * 1000))


async def _preflight(config: BenchConfig, target: Target, http: httpx.AsyncClient) -> None:
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


async def run(config: BenchConfig, console: Console) -> dict[str, Any]:
    target = Target(config.url.rstrip("/"), config.model, config.api_key, config.max_tokens, config.seed)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGINT, stop.set)  # Ctrl-C: finish the turns under way, then report
    try:
        return await _run(config, target, stop, console)
    finally:
        loop.remove_signal_handler(signal.SIGINT)


async def _run(config: BenchConfig, target: Target, stop: asyncio.Event, console: Console) -> dict[str, Any]:
    limits = httpx.Limits(max_connections=config.sessions + 1, max_keepalive_connections=config.sessions + 1)
    interrupted = False
    async with httpx.AsyncClient(timeout=httpx.Timeout(120, connect=10), limits=limits) as http:
        await _preflight(config, target, http)
        if config.mode != "chat":  # chat has no latency marks to put on the client's clock
            target = dataclasses.replace(target, clock=await probe_clock(http, target))
        questions: list[Any] = list(config.prompts)
        if config.spoken:
            rate = RTC_RATE if config.mode == "webrtc" else VOICE_RATE
            questions = await asyncio.to_thread(wav_questions, config.audio, rate) if config.audio else \
                await asyncio.to_thread(spoken_questions, config.prompts, rate)
        cpu_before = resource.getrusage(resource.RUSAGE_SELF)  # the run's own CPU, not the questions' synthesis
        progress = Progress()
        lag = asyncio.create_task(_measure_lag(progress))
        rng = random.Random(config.seed)
        sessions: list[asyncio.Task[None]] = []
        try:
            with Live(progress.line(), console=console, refresh_per_second=4, transient=True) as live:
                for index in range(config.sessions):
                    if stop.is_set():
                        break
                    sessions.append(asyncio.create_task(_session(index, config, target, http, progress, stop, rng, questions)))
                    if config.ramp > 0 and index + 1 < config.sessions:
                        with contextlib.suppress(TimeoutError):
                            await asyncio.wait_for(stop.wait(), 1 / config.ramp)
                    live.update(progress.line())
                pending = set(sessions)
                while pending:
                    done, pending = await asyncio.wait(pending, timeout=0.25)
                    for task in done:
                        if not task.cancelled() and isinstance(task.exception(), BenchError):
                            raise task.exception()  # type: ignore[misc]
                    live.update(progress.line())
        finally:
            interrupted = stop.is_set()
            for task in (*sessions, lag):
                task.cancel()
            await asyncio.gather(*sessions, lag, return_exceptions=True)
    elapsed = progress.elapsed()
    cpu_after = resource.getrusage(resource.RUSAGE_SELF)
    cpu_s = (cpu_after.ru_utime - cpu_before.ru_utime) + (cpu_after.ru_stime - cpu_before.ru_stime)
    overhead = {"loop_lag_ms": summarize(progress.lags_ms), "cpu_percent": round(100 * cpu_s / max(elapsed, 1e-9), 1)}
    report = build_report(progress.turns, config=config.public(), version=_version(), duration_s=elapsed,
                          overhead=overhead, interrupted=interrupted, clock=target.clock)
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
