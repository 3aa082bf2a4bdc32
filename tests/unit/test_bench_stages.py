"""The bench's clock offset and per-stage breakdown (gateway/bench/stages.py), and the clock probe on a mock."""

from __future__ import annotations

import json
import time

import httpx
import pytest

from gateway.bench.clients import Target, probe_clock
from gateway.bench.stages import TEXT_CHAIN, VOICE_CHAIN, ClockOffset, choose_offset, parse_marks, turn_stages


def test_the_offset_comes_from_the_probe_with_the_shortest_round_trip() -> None:
    # (sent, server time_ms, received) on the client's wall clock: the server runs 100 ms ahead.
    probes = [(0.0, 112.0, 20.0), (50.0, 152.0, 54.0), (80.0, 190.0, 100.0)]
    clock = choose_offset(probes, perf_to_wall_ms=1000.0)
    assert clock.offset_ms == 100.0 and clock.uncertainty_ms == 2.0 and clock.rtt_ms == 4.0 and clock.probes == 3
    assert clock.server_ms(2.0) == 2000.0 + 1000.0 + 100.0  # perf seconds -> the server's wall clock in ms
    assert clock.public() == {"offset_ms": 100.0, "uncertainty_ms": 2.0, "rtt_ms": 4.0, "probes": 3}


def voice_marks(epoch_ms: float) -> dict[str, float | None]:
    return {"speech_stopped_ms": 0.0, "transcript_final_ms": 40.0, "response_created_ms": 41.0,
            "generation_started_ms": -90.0, "first_token_ms": 45.5, "first_clause_ms": 60.0, "first_audio_ms": 150.0,
            "last_audio_ms": 900.0, "done_ms": 950.0, "epoch_ms": epoch_ms}


def test_voice_stages_chain_from_the_end_of_speech_to_the_first_audio_received() -> None:
    clock = choose_offset([(0.0, 100.0, 0.0)], perf_to_wall_ms=0.0)  # the server's clock is 100 ms ahead
    # The client's speech ended at perf 10.0 s; the server's speech_stopped came 400 ms later on its own clock.
    marks = voice_marks(epoch_ms=10_000 + 100 + 400)
    stages = turn_stages(marks, VOICE_CHAIN, start=10.0, end=10.6, clock=clock)
    assert stages == {"uplink_vad": 400.0, "asr": 40.0, "response_start": 1.0, "llm_first_token": 4.5,
                      "llm_first_clause": 14.5, "tts_first_audio": 90.0, "downlink": 50.0}
    assert sum(stages.values()) == pytest.approx(600.0)  # the client's voice-to-voice


def test_a_wrong_offset_moves_time_between_uplink_and_downlink_but_not_their_sum() -> None:
    marks = voice_marks(epoch_ms=10_500)
    right = turn_stages(marks, VOICE_CHAIN, start=10.0, end=10.6, clock=choose_offset([(0, 100, 0)], 0.0))
    wrong = turn_stages(marks, VOICE_CHAIN, start=10.0, end=10.6, clock=choose_offset([(0, 130, 0)], 0.0))
    assert wrong["uplink_vad"] == right["uplink_vad"] - 30 and wrong["downlink"] == right["downlink"] + 30
    assert sum(wrong.values()) == pytest.approx(sum(right.values()))


def test_without_a_clock_only_the_server_internal_stages_are_given() -> None:
    marks = {"response_created_ms": 0.0, "first_token_ms": 35.0, "epoch_ms": 5000.0}
    assert turn_stages(marks, TEXT_CHAIN, start=1.0, end=1.05, clock=None) == {"llm_first_token": 35.0}
    clock = choose_offset([(0.0, 0.0, 2.0)], perf_to_wall_ms=0.0)
    assert turn_stages(marks, TEXT_CHAIN, start=4.998, end=5.037, clock=clock) == {
        "uplink": 3.0, "llm_first_token": 35.0, "downlink": 1.0}


def test_missing_marks_leave_their_stages_out() -> None:
    clock = choose_offset([(0.0, 0.0, 0.0)], 0.0)
    marks = {"speech_stopped_ms": 0.0, "transcript_final_ms": 30.0, "response_created_ms": None, "epoch_ms": None}
    assert turn_stages(marks, VOICE_CHAIN, start=1.0, end=2.0, clock=clock) == {"asr": 30.0}
    assert turn_stages(None, VOICE_CHAIN, start=1.0, end=2.0, clock=clock) == {}


def test_marks_are_read_from_response_metadata() -> None:
    marks = {"first_token_ms": 12.5, "epoch_ms": 1.0}
    assert parse_marks({"metadata": {"gateway_latency": json.dumps(marks)}}) == marks
    assert parse_marks({"metadata": None}) is None  # a server without marks
    assert parse_marks({"metadata": {"gateway_latency": "not json"}}) is None
    assert parse_marks({"metadata": {"gateway_latency": "[1, 2]"}}) is None


async def test_the_clock_probe_reads_healthz_and_gives_up_on_a_server_without_time_ms() -> None:
    def gateway(request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/healthz" and "authorization" not in request.headers
        return httpx.Response(200, json={"status": "ready", "time_ms": time.time() * 1000 + 5000})

    target = Target("http://server", "m", "sk-secret", 16, None)
    async with httpx.AsyncClient(transport=httpx.MockTransport(gateway)) as http:
        clock = await probe_clock(http, target, probes=4)
    assert clock is not None and clock.probes == 4 and abs(clock.offset_ms - 5000) < 50
    assert abs(clock.server_ms(time.perf_counter()) - (time.time() * 1000 + 5000)) < 50

    for peer in (httpx.Response(404, text="Not Found"), httpx.Response(200, json={"status": "ok"})):
        async with httpx.AsyncClient(transport=httpx.MockTransport(lambda request, peer=peer: peer)) as http:
            assert await probe_clock(http, target) is None


def test_a_stage_may_start_at_the_first_of_several_marks_the_server_sent() -> None:
    chain = (("tts_first_audio", ("first_clause", "first_token"), "first_audio"),)
    marks = voice_marks(0.0)
    assert turn_stages(marks, chain, start=None, end=None, clock=None) == {"tts_first_audio": 90.0}
    marks["first_clause_ms"] = None  # no clause marked: from the first token
    assert turn_stages(marks, chain, start=None, end=None, clock=None) == {"tts_first_audio": 104.5}


def test_a_server_on_the_same_clock_has_no_offset() -> None:
    clock = ClockOffset.same_clock(perf_to_wall_ms=5000.0)
    assert clock.server_ms(2.0) == 7000.0 and clock.offset_ms == 0.0
