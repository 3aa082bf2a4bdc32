"""Whether a user's turn is over, judged while its silence runs: the audio end-of-turn model (inference/turn_end.py)
on the turn's audio so far, and the LLM (inference/llm/end_of_turn.py) on its words once the speculative transcript
has them, side by side. A judge that is not there (no audio model installed; no LLM judge with --llm-backend) or
that fails counts as absent; the core combines what they say (session_config.turn_end_wait_ms)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import numpy as np

from gateway.generation.llm_errors import BACKEND_ERRORS
from gateway.generation.runtime import Runtime
from gateway.platform import metrics
from gateway.realtime.reply_ahead import screened
from inference.asr import Transcript
from inference.transcript_checks import heard_surely


@dataclass(frozen=True)
class Judged:
    """The audio model's and the LLM's probabilities that the turn is complete (None: that judge is absent), and
    whether Whisper was sure of the words the LLM read."""

    audio: float | None
    text: float | None
    words_sure: bool


class TurnJudges:
    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime

    async def judge(self, audio: np.ndarray, speculative: asyncio.Task[Transcript | None]) -> Judged:
        """What the judges say of the turn so far. `audio`: 16 kHz float32."""
        heard, (words, sure) = await asyncio.gather(self._audio(audio), self._words(speculative))
        return Judged(heard, words, sure)

    async def _audio(self, audio: np.ndarray) -> float | None:
        model = self.runtime.turn_end
        if model is None:
            return None
        started = time.perf_counter()
        probability = await model.probability(audio)
        metrics.END_OF_TURN_SECONDS.labels("audio").observe(time.perf_counter() - started)
        return probability

    async def _words(self, speculative: asyncio.Task[Transcript | None]) -> tuple[float | None, bool]:
        end_of_turn = self.runtime.end_of_turn
        if end_of_turn is None:
            return None, True
        started = time.perf_counter()
        transcript = await asyncio.shield(speculative)  # the transcript goes on serving the turn if this stops
        words = screened(self.runtime.safety, transcript.text) if transcript is not None else None
        if transcript is None or words is None:
            return None, True
        try:
            probability = await end_of_turn.probability(words)
        except BACKEND_ERRORS:
            return None, True
        metrics.END_OF_TURN_SECONDS.labels("text").observe(time.perf_counter() - started)
        return probability, heard_surely(transcript.avg_logprob)
