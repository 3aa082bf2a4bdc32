"""What one benchmark turn measured, and the distribution of each metric over a run."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

# The metrics of report.json, in milliseconds, each summarised over every turn that has it.
METRICS = ("ttft_ms", "first_audio_ms", "voice_to_voice_ms", "barge_in_ms", "itl_ms")
QUANTILES = (50, 90, 95, 99)


@dataclass
class TurnRecord:
    session: int
    turn: int
    started_at: float  # seconds since the run began
    ttft_ms: float | None = None  # request sent (or end of speech) -> first text token
    first_audio_ms: float | None = None  # -> first answer audio
    voice_to_voice_ms: float | None = None  # end of the user's speech in the audio sent -> first answer audio
    barge_in_ms: float | None = None  # onset of the speech sent over the answer -> the answer stopped (voice.py)
    barge_in_missed: bool = False  # --barge-in: the answer was over (or not stopped) before the interruption
    total_ms: float | None = None  # -> the turn's last event
    audio_rtf: float | None = None  # how long the answer audio took to arrive, per second of it
    # The silence a listener playing the answer from its first audio would hear within it: audio that came after
    # the audio before it had played out (WebSocket; voice.py's playback_stall_ms).
    audio_stall_ms: float | None = None
    output_tokens: int = 0  # text deltas received (a delta is a token on the servers measured here)
    itl_ms: list[float] = field(default_factory=list)  # gaps between consecutive text deltas
    error: str | None = None  # an error code, when the turn failed
    question: int | None = None  # which question (its line of --prompt-file, its file of --audio in name order)
    stages: dict[str, float] = field(default_factory=dict)  # the server's marks, per stage (stages.py)

    @property
    def tokens_per_s(self) -> float | None:
        if self.ttft_ms is None or self.total_ms is None or self.output_tokens < 2 or self.total_ms <= self.ttft_ms:
            return None
        return (self.output_tokens - 1) / ((self.total_ms - self.ttft_ms) / 1000)

    def row(self) -> dict[str, Any]:
        """One line of turns.csv."""
        row = asdict(self)
        stages = row.pop("stages")
        row["itl_ms"] = round(sum(self.itl_ms) / len(self.itl_ms), 2) if self.itl_ms else None
        row["tokens_per_s"] = round(self.tokens_per_s, 2) if self.tokens_per_s is not None else None
        row.update({f"stage_{name}_ms": value for name, value in stages.items()})
        return row


def percentile(values: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default)."""
    ordered = sorted(values)
    if len(ordered) == 1:
        return ordered[0]
    rank = (len(ordered) - 1) * q / 100
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def summarize(values: list[float]) -> dict[str, float | int | None]:
    if not values:
        return {"count": 0, **{f"p{q}": None for q in QUANTILES}, "max": None, "mean": None}
    summary: dict[str, float | int | None] = {"count": len(values)}
    for q in QUANTILES:
        summary[f"p{q}"] = round(percentile(values, q), 2)
    summary["max"] = round(max(values), 2)
    summary["mean"] = round(sum(values) / len(values), 2)
    return summary


def describe(values: list[float]) -> dict[str, float | int]:
    """The scripts' summary (benchmarks/): p50 and p95, mean, min and max rounded to 0.1, and n; {"n": 0} for none."""
    if not values:
        return {"n": 0}
    return {"p50": round(percentile(values, 50), 1), "p95": round(percentile(values, 95), 1),
            "mean": round(sum(values) / len(values), 1), "min": round(min(values), 1), "max": round(max(values), 1),
            "n": len(values)}


def metric_values(turns: list[TurnRecord], metric: str) -> list[float]:
    if metric == "itl_ms":
        return [gap for turn in turns if turn.error is None for gap in turn.itl_ms]
    return [value for turn in turns if turn.error is None and (value := getattr(turn, metric)) is not None]


def stage_values(turns: list[TurnRecord], stage: str) -> list[float]:
    return [value for turn in turns if turn.error is None and (value := turn.stages.get(stage)) is not None]
