"""The bench's run without a server (gateway/bench/runner.py): each session's seeded workload, the live line of
a spoken run, and the opening of a session on a WebSocket server that says nothing."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
import websockets

from gateway.bench.clients import BenchError, RealtimeTextClient, Target
from gateway.bench.runner import Progress, SessionPlan
from gateway.bench.stats import TurnRecord


def draws(plan: SessionPlan, turns: int) -> list[tuple[int, float]]:
    return [(plan.question(turn), plan.think_time(2.0)) for turn in range(turns)]


def test_a_session_draws_the_same_workload_for_the_same_seed_whatever_the_others_draw() -> None:
    alone = draws(SessionPlan(seed=7, index=1, questions=6), 12)
    # Another session drawing in between (sessions run at once) changes nothing: each has its own generator.
    first, second = SessionPlan(seed=7, index=0, questions=6), SessionPlan(seed=7, index=1, questions=6)
    interleaved = []
    for turn in range(12):
        draws(first, 3)
        interleaved.append((second.question(turn), second.think_time(2.0)))
    assert interleaved == alone
    assert sorted(question for question, _ in alone[:6]) == list(range(6))  # every question, then again
    assert [question for question, _ in alone[:6]] == [question for question, _ in alone[6:]]
    assert all(0 <= think <= 2.0 for _, think in alone)
    assert draws(SessionPlan(seed=8, index=1, questions=6), 12) != alone
    assert draws(SessionPlan(seed=7, index=2, questions=6), 12) != alone
    assert SessionPlan(seed=7, index=1, questions=6).think_time(0) == 0.0


def spoken_turn(turn: int, ttft_ms: float, voice_to_voice_ms: float | None, error: str | None = None) -> TurnRecord:
    return TurnRecord(session=0, turn=turn, started_at=float(turn), ttft_ms=ttft_ms,
                      voice_to_voice_ms=voice_to_voice_ms, error=error)


def test_the_live_line_of_a_spoken_run_shows_voice_to_voice_too() -> None:
    turns = [spoken_turn(0, 100, 400), spoken_turn(1, 200, 600), spoken_turn(2, 900, 9000, error="timeout")]
    spoken = Progress(spoken=True, turns=turns)
    assert "TTFT p50 150 ms, p95 195 ms" in spoken.line() and "voice-to-voice p50 500 ms, p95 590 ms" in spoken.line()
    assert "errors 1" in spoken.line()
    assert "voice-to-voice" not in Progress(spoken=False, turns=turns).line()
    assert "voice-to-voice -" in Progress(spoken=True).line()


@pytest.fixture
async def silent_realtime_server() -> AsyncIterator[str]:
    """Accepts a WebSocket and never says a word: not a Realtime server."""

    async def say_nothing(connection: websockets.ServerConnection) -> None:
        await connection.wait_closed()

    async with websockets.serve(say_nothing, "127.0.0.1", 0) as server:
        port = next(iter(server.sockets)).getsockname()[1]
        yield f"http://127.0.0.1:{port}"


async def test_a_websocket_server_that_sends_no_session_created_is_one_bench_error(silent_realtime_server: str) -> None:
    target = Target(silent_realtime_server, "m", None, 8, None)
    with pytest.raises(BenchError, match=r"not a Realtime server: .* sent no session.created within 0.5 s"):
        await asyncio.wait_for(RealtimeTextClient.open(target, None, timeout_s=0.5), 10)


async def test_a_refused_response_create_ends_the_turn_with_its_code() -> None:
    """A server that answers response.create with an error and starts no response (as a rate limit does):
    the turn ends with the error's code, rather than waiting out its timeout for a response.done."""

    async def refuse(connection: websockets.ServerConnection) -> None:
        await connection.send('{"type": "session.created", "session": {"type": "realtime", "id": "s"}}')
        async for message in connection:
            if '"response.create"' in str(message):
                await connection.send('{"type": "error", "error": {"type": "rate_limit_error", '
                                      '"code": "rate_limit_exceeded", "message": "slow down"}}')

    async with websockets.serve(refuse, "127.0.0.1", 0) as server:
        port = next(iter(server.sockets)).getsockname()[1]
        client = await RealtimeTextClient.open(Target(f"http://127.0.0.1:{port}", "m", None, 8, None), None)
        record = TurnRecord(session=0, turn=0, started_at=0.0)
        await client.turn(record, "Hello?", timeout_s=10)
        await client.close()
    assert record.error == "rate_limit_exceeded" and record.ttft_ms is None and record.total_ms is not None
