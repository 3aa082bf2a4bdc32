"""The server's view of a turn beside the client's: the latency marks a gateway puts in response.done
(`response.metadata.gateway_latency`), cut into stages that chain from the client's start of the turn to
its first answer, and the clock offset that puts the client's times on the server's clock. No I/O here.

A chain's stages add up to the client's own measurement (voice: voice-to-voice; text: TTFT): the two
stages that cross clocks (uplink, downlink) use the same offset, so its error moves time between them
but never changes their sum.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

CLIENT = "client"  # a chain's ends: the client's start of the turn, and its first answer received

# (stage, from, to): the marks are TurnMarks' names (gateway/platform/latency.py); a tuple of marks is the first
# of them that the server sent.
Mark = str | tuple[str, ...]
Chain = tuple[tuple[str, Mark, Mark], ...]
VOICE_CHAIN = (
    ("uplink_vad", CLIENT, "speech_stopped"),  # the speech's end travelling, and the VAD's silence wait
    ("asr", "speech_stopped", "transcript_final"),
    ("response_start", "transcript_final", "response_created"),
    ("llm_first_token", "response_created", "first_token"),
    ("llm_first_clause", "first_token", "first_clause"),
    ("tts_first_audio", "first_clause", "first_audio"),
    ("downlink", "first_audio", CLIENT),
)
TEXT_CHAIN = (
    ("uplink", CLIENT, "response_created"),
    ("llm_first_token", "response_created", "first_token"),
    ("downlink", "first_token", CLIENT),
)
# The client's metric that each mode's chain adds up to; chat has no marks.
MEASURED = {"text": "ttft_ms", "voice": "voice_to_voice_ms", "webrtc": "voice_to_voice_ms", "twilio": "voice_to_voice_ms",
            "telnyx": "voice_to_voice_ms", "plivo": "voice_to_voice_ms", "sip": "voice_to_voice_ms", "live": "voice_to_voice_ms"}
STAGES = ("uplink", "uplink_vad", "asr", "response_start", "llm_first_token", "llm_first_clause", "tts_first_audio",
          "downlink")  # the report's order


@dataclass(frozen=True)
class ClockOffset:
    """The server's wall clock minus the client's, from the /healthz probe with the shortest round trip."""

    offset_ms: float
    uncertainty_ms: float  # half that probe's round trip: the server read its clock somewhere inside it
    rtt_ms: float
    probes: int
    perf_to_wall_ms: float  # the client's wall clock minus its perf_counter, which times the turns

    @classmethod
    def same_clock(cls, perf_to_wall_ms: float) -> ClockOffset:
        """A server that reads the client's own wall clock (benchmarks/voice.py, on one machine): no offset."""
        return cls(offset_ms=0.0, uncertainty_ms=0.0, rtt_ms=0.0, probes=0, perf_to_wall_ms=perf_to_wall_ms)

    def server_ms(self, perf: float) -> float:
        """A client perf_counter reading on the server's wall clock, in ms."""
        return perf * 1000 + self.perf_to_wall_ms + self.offset_ms

    def public(self) -> dict[str, Any]:
        return {"offset_ms": round(self.offset_ms, 2), "uncertainty_ms": round(self.uncertainty_ms, 2),
                "rtt_ms": round(self.rtt_ms, 2), "probes": self.probes}


def choose_offset(probes: list[tuple[float, float, float]], perf_to_wall_ms: float) -> ClockOffset:
    """NTP's choice: probes are (sent, server time_ms, received), sent and received on the client's wall clock
    in ms; the server read its clock between them, so the shortest round trip bounds the offset best."""
    sent, server, received = min(probes, key=lambda probe: probe[2] - probe[0])
    rtt = received - sent
    return ClockOffset(offset_ms=server - (sent + received) / 2, uncertainty_ms=rtt / 2, rtt_ms=rtt,
                       probes=len(probes), perf_to_wall_ms=perf_to_wall_ms)


def parse_marks(response: dict[str, Any]) -> dict[str, Any] | None:
    """The latency marks of a response.done's response, if the server sent them."""
    raw = (response.get("metadata") or {}).get("gateway_latency")
    try:
        marks = json.loads(raw) if isinstance(raw, str) else None
    except ValueError:
        return None
    return marks if isinstance(marks, dict) else None


def turn_stages(marks: dict[str, Any] | None, chain: Chain, *, start: float | None,
                end: float | None, clock: ClockOffset | None) -> dict[str, float]:
    """Milliseconds per stage. `start` and `end` are the client's perf_counter times of the chain's ends;
    the stages between server marks need no clock, the two that cross clocks need `clock` and epoch_ms."""
    if marks is None:
        return {}

    def relative(mark: Mark) -> float | None:  # ms since the turn's origin on the server
        for name in (mark,) if isinstance(mark, str) else mark:
            if isinstance(value := marks.get(f"{name}_ms"), int | float):
                return float(value)
        return None

    epoch = marks.get("epoch_ms")
    stages: dict[str, float] = {}
    for name, first, last in chain:
        if CLIENT in (first, last):
            mark = relative(last if first == CLIENT else first)
            client = start if first == CLIENT else end
            if mark is None or client is None or clock is None or not isinstance(epoch, int | float):
                continue
            server, client_ms = epoch + mark, clock.server_ms(client)
            value = server - client_ms if first == CLIENT else client_ms - server
        else:
            begin, finish = relative(first), relative(last)
            if begin is None or finish is None:
                continue
            value = finish - begin
        stages[name] = round(value, 1)
    return stages
