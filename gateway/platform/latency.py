"""Per-turn latency marks: when each stage of a turn happened, sent with every response.done."""

from __future__ import annotations

import time
from dataclasses import dataclass, fields


def now() -> float:
    return time.monotonic()


@dataclass
class TurnMarks:
    """Monotonic timestamps (seconds); None when the stage did not happen in this turn."""

    speech_stopped: float | None = None  # the VAD decided the user's turn ended
    transcript_final: float | None = None  # the final transcript of that turn
    response_created: float | None = None
    generation_started: float | None = None  # the reply's generation was submitted: before speech_stopped when preempted
    first_token: float | None = None
    first_clause: float | None = None  # the first clause was complete and handed to TTS
    first_audio: float | None = None  # first answer audio handed to the transport
    last_audio: float | None = None
    classifier_done: float | None = None  # the safety classifier's last verdict on the turn (gateway/safety/hooks.py)
    done: float | None = None

    def mark(self, stage: str, *, latest: bool = False) -> None:
        """Record when a stage happened: its first occurrence, or with `latest` its most recent one."""
        if latest or getattr(self, stage) is None:
            setattr(self, stage, now())

    def to_wire(self) -> dict[str, float | None]:
        """Milliseconds since the start of the turn (speech stopped, else response created)."""
        origin = self.speech_stopped if self.speech_stopped is not None else self.response_created
        marks: dict[str, float | None] = {}
        for stage in fields(self):
            value = getattr(self, stage.name)
            marks[f"{stage.name}_ms"] = None if value is None or origin is None else round((value - origin) * 1000, 1)
        marks["epoch_ms"] = round((time.time() - (now() - origin)) * 1000) if origin is not None else None
        return marks

    def stage_durations(self) -> dict[str, float]:
        """Seconds spent in each stage, for the metrics histograms."""
        durations: dict[str, float] = {}
        pairs = (
            ("asr", self.speech_stopped, self.transcript_final),
            ("llm_first_token", self.response_created, self.first_token),
            ("llm_first_clause", self.first_token, self.first_clause),
            ("tts_first_audio", self.first_clause, self.first_audio),
            ("voice_to_voice", self.speech_stopped, self.first_audio),
            ("safety_classifier", self.response_created, self.classifier_done),
        )
        for name, start, end in pairs:
            if start is not None and end is not None:
                durations[name] = end - start
        return durations
