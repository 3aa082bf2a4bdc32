"""A reply generated before its turn ends: text, and the first clause's speech, made ahead.

The voice path starts it from the speculative final transcript while the VAD waits out the silence
(see voice.py). `run_ahead` takes the generation's text as it comes and, when the reply will be
spoken, synthesizes its first clause at once. Nothing reaches the client from here: the turn's
response adopts the preemption when its prompt and sampling are the same (see responses.py),
replays the text, and plays the first clause's audio without waiting for Piper. Otherwise the
preemption is cancelled.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import numpy as np

from gateway.generation.memory_tool import Generation
from gateway.platform import metrics
from inference.llm.backend import GenerationResult, SamplingParams
from inference.text import ClauseSplitter
from inference.tts import TtsEngine


@dataclass(eq=False)
class Preemption:
    prompt_ids: list[int]
    sampling: SamplingParams
    stream: Generation  # the engine's, or the generation service's Reply (gateway/generation/service.py)
    started_at: float  # monotonic
    deltas: list[str] = field(default_factory=list)  # the text so far, taken from the stream by run_ahead
    first_clause: str | None = None
    first_clause_audio: list[np.ndarray] | None = None  # Piper's audio of first_clause, when the reply speaks
    speech_speed: float = 1.0  # what first_clause_audio was spoken at
    _changed: asyncio.Event = field(default_factory=asyncio.Event)
    _first_clause_done: asyncio.Event = field(default_factory=asyncio.Event)
    _ended: bool = False
    _error: BaseException | None = None
    _dropped: bool = False

    def cancel(self) -> None:
        """Drop it, unadopted: generation stops and run_ahead ends with the stream (idempotent)."""
        if not self._dropped:
            self._dropped = True
            self.stream.cancel()
            metrics.PREEMPTIONS.labels("dropped").inc()

    async def run_ahead(self, tts: TtsEngine | None, speed: float = 1.0) -> None:
        """The only reader of the stream: keeps its text, and speaks the first clause with `tts` at `speed`."""
        self.speech_speed = speed
        splitter = ClauseSplitter()
        try:
            async for delta in self.stream:
                self.deltas.append(delta)
                self._changed.set()
                if self.first_clause is None and (clauses := splitter.push(delta)):
                    await self._speak_first(clauses[0], tts)
            if self.first_clause is None and (clauses := splitter.flush()):
                await self._speak_first(clauses[0], tts)
        except Exception as exc:  # the response that adopts this reports it
            self._error = exc
        finally:
            self._ended = True
            self._changed.set()
            self._first_clause_done.set()

    async def _speak_first(self, clause: str, tts: TtsEngine | None) -> None:
        self.first_clause = clause
        if tts is not None:
            self.first_clause_audio = [pcm async for pcm in tts.synthesize(clause, first_clause=True, speed=self.speech_speed)]
        self._first_clause_done.set()

    async def replay(self) -> AsyncIterator[str]:
        """Every text delta of the generation, from the first, as run_ahead receives them."""
        sent = 0
        while True:
            if sent < len(self.deltas):
                sent += 1
                yield self.deltas[sent - 1]
                continue
            if self._ended:
                if self._error is not None:
                    raise self._error
                return
            self._changed.clear()
            await self._changed.wait()

    async def audio_for(self, clause: str) -> list[np.ndarray] | None:
        """The audio made ahead for `clause`, when it is the first clause and was spoken ahead."""
        await self._first_clause_done.wait()
        return self.first_clause_audio if clause == self.first_clause else None


class AdoptedStream:
    """An adopted preemption, read as the response reads a generation: its text replayed from the first delta."""

    def __init__(self, preemption: Preemption) -> None:
        self.preemption = preemption

    def __aiter__(self) -> AsyncIterator[str]:
        return self.preemption.replay()

    async def result(self) -> GenerationResult:
        return await self.preemption.stream.result()

    def cancel(self) -> None:
        self.preemption.stream.cancel()

    def pace(self, not_needed_before: float) -> None:
        self.preemption.stream.pace(not_needed_before)
