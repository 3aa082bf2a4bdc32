"""Prometheus metrics, served at GET /metrics."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from inference.cpu import core_seconds

REGISTRY = CollectorRegistry()

_LATENCY_BUCKETS = (0.025, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0)
_SHORT_BUCKETS = (0.001, 0.005, 0.01, *_LATENCY_BUCKETS)  # queue waits and per-call model times

HTTP_REQUESTS = Counter(
    "gateway_http_requests_total", "HTTP requests by route and status", ["route", "status"], registry=REGISTRY
)
SIP_INVITES = Counter("gateway_sip_invites_total", "New INVITEs on the SIP trunk by what became of them (rang, or the "
                      "status they were refused with)", ["outcome"], registry=REGISTRY)
ERRORS = Counter("gateway_errors_total", "Errors sent to clients", ["surface", "code"], registry=REGISTRY)
CLIENT_EVENTS = Counter("gateway_realtime_client_events_total", "Realtime client events", ["type"], registry=REGISTRY)
ACTIVE_SESSIONS = Gauge("gateway_active_sessions", "Open Realtime sessions", ["transport"], registry=REGISTRY)
RESPONSES = Counter("gateway_realtime_responses_total", "Realtime responses by final status", ["status"], registry=REGISTRY)
SAFETY_FINDINGS = Counter("gateway_safety_findings_total", "Matches of the safety policy (gateway/safety/)",
                          ["stage", "rule", "action"], registry=REGISTRY)
SAFETY_CLASSIFIER_FAILURES = Counter("gateway_safety_classifier_failures_total",
                                     "Safety classifier verdicts missing (error, timeout): the reply went out",
                                     ["kind"], registry=REGISTRY)
STAGE_SECONDS = Histogram(
    "gateway_turn_stage_seconds",
    "Per-turn latency of each stage (asr, llm_first_token, tts_first_audio, voice_to_voice)",
    ["stage"],
    buckets=_LATENCY_BUCKETS,
    registry=REGISTRY,
)
PREEMPTIONS = Counter(
    "gateway_voice_preemptions_total",
    "Replies generated before the end of the user's turn: adopted by the turn's response, or dropped "
    "(the user went on speaking, or the final transcript or prompt differed)",
    ["outcome"],
    registry=REGISTRY,
)
CHAT_TTFT_SECONDS = Histogram(
    "gateway_chat_time_to_first_token_seconds", "Chat completions time to first token", buckets=_LATENCY_BUCKETS, registry=REGISTRY
)
BATCH_SIZE = Histogram(
    "gateway_engine_batch_size", "Requests in each step of the in-process engine (decoding rows and prompt chunks)",
    buckets=(1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64), registry=REGISTRY,
)
COMPLETIONS_TTFT_SECONDS = Histogram(
    "gateway_completions_time_to_first_token_seconds", "Completions (/v1/completions, token-id prompts of other "
    "gateways) time to first token", buckets=_LATENCY_BUCKETS, registry=REGISTRY
)
QUEUE_WAIT_SECONDS = Histogram(
    "gateway_engine_queue_wait_seconds", "Time a generation waited in the engine's queue before it was scheduled",
    ["api"], buckets=_SHORT_BUCKETS, registry=REGISTRY,
)
ASR_CALL_SECONDS = Histogram(
    "gateway_asr_call_seconds", "Whisper's time per transcription (partial or final)", ["kind"],
    buckets=_SHORT_BUCKETS, registry=REGISTRY,
)
TTS_CLAUSE_SECONDS = Histogram(
    "gateway_tts_clause_seconds", "Piper's time per clause of a spoken reply", buckets=_SHORT_BUCKETS, registry=REGISTRY
)
NOISE_REDUCTION_FRAME_SECONDS = Histogram(
    "gateway_noise_reduction_frame_seconds", "DeepFilterNet's time per 20 ms frame of input audio (noise_reduction)",
    buckets=(0.0005, 0.001, 0.002, 0.003, 0.005, 0.01, 0.02, 0.05), registry=REGISTRY,
)
END_OF_TURN_SECONDS = Histogram(
    "gateway_end_of_turn_seconds", "The end-of-turn judges' time, from the silence they judge to their answer",
    ["judge"], buckets=_SHORT_BUCKETS, registry=REGISTRY,
)
PAUSED_REPLIES = Counter(
    "gateway_paused_replies_total", "Holds of a reply's audio by speech over it (--resume-false-interruptions), by how "
    "each ended: the speech was a backchannel, a cough or noise (resumed), or words for the assistant (interrupted)",
    ["outcome"], registry=REGISTRY,
)
REPLY_PAUSE_SECONDS = Histogram(
    "gateway_reply_pause_seconds", "How long a reply's audio was held by speech over it (--resume-false-interruptions), "
    "from the pause to its end, by how it ended: the audio played on (resumed) or was cut (interrupted)",
    ["outcome"], buckets=_SHORT_BUCKETS, registry=REGISTRY,
)
BARGE_IN_SECONDS = Histogram(
    "gateway_barge_in_seconds", "From the interruption (speech detected, or cancel) to the reply stopped and trimmed",
    buckets=_SHORT_BUCKETS, registry=REGISTRY,
)


class StatsCollector(Collector):
    """Reads a component's counters (a `stats()` dict) at scrape time, as gauges named `<prefix><key>`."""

    def __init__(self, prefix: str, component: str) -> None:
        self.prefix = prefix
        self.component = component
        self.stats: Callable[[], dict[str, float]] | None = None

    def collect(self) -> Iterator[GaugeMetricFamily]:
        stats = self.stats() if self.stats is not None else {}
        for name, value in sorted(stats.items()):
            yield GaugeMetricFamily(f"{self.prefix}{name}", f"{self.component}: {name.replace('_', ' ')}", value=float(value))

    def describe(self) -> Iterator[GaugeMetricFamily]:
        return iter(())


ENGINE = StatsCollector("gateway_engine_", "LLM engine")  # prefix cache hits, queue depth, threads, ...
ASR = StatsCollector("gateway_asr_", "ASR")  # short-window decodes and their retries over 30 s
REGISTRY.register(ENGINE)
REGISTRY.register(ASR)


class CoreSecondsCollector(Collector):
    """The core-seconds each kind of model work has held (inference/cpu.py): `gateway bench --sessions 1,2,4`
    divides their growth over a level by its turns, beside the process's own CPU seconds."""

    def collect(self) -> Iterator[CounterMetricFamily]:
        family = CounterMetricFamily("gateway_core_seconds", "Core-seconds held by model work (a call's wall time "
                                     "times the cores it runs on), by kind of work", labels=["work"])
        for work, seconds in sorted(core_seconds().items()):
            family.add_metric([work], seconds)
        yield family

    def describe(self) -> Iterator[CounterMetricFamily]:
        return iter(())


REGISTRY.register(CoreSecondsCollector())
ProcessCollector(registry=REGISTRY)  # process_cpu_seconds_total, resident memory, open files
