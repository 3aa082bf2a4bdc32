"""Preemption's bookkeeping: the text replayed to the adopting response, and the first clause spoken ahead."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import numpy as np
import pytest

from gateway.platform import metrics
from gateway.realtime.preemption import Preemption
from inference.llm.backend import SamplingParams


class Deltas:
    """Text deltas that arrive one by one, as from the engine; `fail` raises after them."""

    def __init__(self, deltas: list[str], fail: Exception | None = None) -> None:
        self.deltas, self.fail, self.cancelled = deltas, fail, False

    async def __aiter__(self) -> AsyncIterator[str]:
        for delta in self.deltas:
            await asyncio.sleep(0.001)
            yield delta
        if self.fail is not None:
            raise self.fail

    def cancel(self) -> None:
        self.cancelled = True


class Voice:
    def __init__(self) -> None:
        self.spoken: list[str] = []
        self.speeds: list[float] = []

    async def synthesize(self, text: str, *, first_clause: bool = False, speed: float = 1.0) -> AsyncIterator[np.ndarray]:
        assert first_clause  # what the preemption speaks ahead is always a reply's first clause
        self.spoken.append(text)
        self.speeds.append(speed)
        yield np.full(10, len(text), dtype=np.int16)


def preemption(stream: Deltas) -> Preemption:
    return Preemption(prompt_ids=[1, 2], sampling=SamplingParams(), stream=stream, started_at=0.0)  # type: ignore[arg-type]


async def collect(p: Preemption) -> list[str]:
    return [delta async for delta in p.replay()]


async def test_replay_gives_every_delta_in_order_whenever_it_starts() -> None:
    p = preemption(Deltas(["The capital", " of France", " is Paris.", " It is big."]))
    voice = Voice()
    ahead = asyncio.create_task(p.run_ahead(voice))  # type: ignore[arg-type]
    early = asyncio.create_task(collect(p))
    await asyncio.sleep(0.002)
    middle = asyncio.create_task(collect(p))
    await ahead
    late = await collect(p)
    expected = ["The capital", " of France", " is Paris.", " It is big."]
    assert await early == expected and await middle == expected and late == expected
    # Only the first clause was spoken ahead; the response asks for it by its text.
    assert voice.spoken == ["The capital of France is Paris."]
    audio = await p.audio_for("The capital of France is Paris.")
    assert audio is not None and int(audio[0][0]) == len("The capital of France is Paris.")
    assert await p.audio_for("It is big.") is None


async def test_a_reply_without_a_clause_boundary_is_spoken_when_it_ends() -> None:
    p = preemption(Deltas(["Yes"]))
    voice = Voice()
    await p.run_ahead(voice)  # type: ignore[arg-type]
    assert voice.spoken == ["Yes"] and await p.audio_for("Yes") is not None


async def test_text_only_replies_speak_nothing_ahead() -> None:
    p = preemption(Deltas(["Sure, here it is."]))
    await p.run_ahead(None)
    assert p.first_clause is not None and await p.audio_for(p.first_clause) is None


async def test_a_generation_error_reaches_the_adopting_response() -> None:
    p = preemption(Deltas(["Part"], fail=RuntimeError("engine failed")))
    await p.run_ahead(None)
    with pytest.raises(RuntimeError, match="engine failed"):
        await collect(p)


def dropped() -> float:
    return metrics.REGISTRY.get_sample_value("gateway_voice_preemptions_total", {"outcome": "dropped"}) or 0.0


def test_cancel_stops_the_generation_and_counts_one_drop() -> None:
    stream = Deltas([])
    p = preemption(stream)
    before = dropped()
    p.cancel()
    p.cancel()  # every owner that gives up on it may cancel it
    assert stream.cancelled and dropped() == before + 1
