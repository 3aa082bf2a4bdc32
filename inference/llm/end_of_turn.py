"""Semantic end of turn: how likely the user's words so far are a finished turn, from the chat LLM itself.

The idea of LiveKit's turn detector (a SmolLM2 fine-tuned for it), with the instruct model as it is:
the user's text goes into the chat template without its final punctuation, and the probability that
the model would end it there (its end-of-message token, or ".", "?", "!") is the turn's probability of
being over. The punctuation is dropped because Whisper adds it to cut-off phrases as well ("What is the
capital of?"). On the embedded model (measured, float32): "What is the capital of France" 0.93, "No, I
don't think so" 0.39, "Yes" 0.18, "Hello" 0.03, "What is the capital of" 0.000, "I want to book a table
for" 0.000. One question is a one-token request to the engine (SamplingParams.probe_ids), batched with
the others: about 30 tokens of prefill.
"""

from __future__ import annotations

import asyncio
import re
from typing import Any

from inference.llm.backend import LLMBackend, SamplingParams

END_MARKERS = ("<|im_end|>", "<|eot_id|>", "<|end|>", "<end_of_turn>")
SENTENCE_ENDS = (".", "?", "!")
_TRAILING_PUNCTUATION = re.compile(r"[\s.?!,;:\u2026]+$")


def ending_ids(tokenizer: Any, eos_ids: frozenset[int]) -> tuple[int, ...]:
    """The tokens that end the user's message: the end-of-message markers and sentence-final punctuation."""
    ids = {tokenizer.convert_tokens_to_ids(marker) for marker in END_MARKERS}
    ids = {i for i in ids if isinstance(i, int) and i != tokenizer.unk_token_id} | set(eos_ids)
    for mark in SENTENCE_ENDS:
        encoded = tokenizer(mark, add_special_tokens=False)["input_ids"]
        if len(encoded) == 1:
            ids.add(encoded[0])
    return tuple(sorted(ids))


def user_turn_ids(tokenizer: Any, text: str) -> list[int]:
    """The chat template of one user message, cut right after its text (before its end-of-message token)."""
    marker = "\u2063"
    templated = tokenizer.apply_chat_template([{"role": "user", "content": text + marker}], tokenize=False)
    return list(tokenizer(templated[: templated.rfind(marker)], add_special_tokens=False)["input_ids"])


class EndOfTurnModel:
    def __init__(self, engine: LLMBackend) -> None:
        self._engine = engine
        self._params = SamplingParams(temperature=0.0, repetition_penalty=1.0, max_tokens=1,
                                      probe_ids=ending_ids(engine.lm.tokenizer, engine.lm.eos_token_ids))

    async def probability(self, text: str) -> float:
        """P(the turn is over | its words so far). Raises what the engine raises when it is full."""
        words = _TRAILING_PUNCTUATION.sub("", text.strip())
        if not words:
            return 0.0
        ids = await asyncio.to_thread(user_turn_ids, self._engine.lm.tokenizer, words)
        stream = self._engine.submit(ids, self._params)
        try:
            result = await stream.result()
        finally:
            stream.cancel()  # no-op once finished; frees the slot if this task was cancelled
        return result.first_step_probability or 0.0
