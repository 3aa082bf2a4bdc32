"""A request as the engine takes it (vLLM v1's input processor): the prompt checked against the vocabulary
and the context window, the sampler and the text output built, all on the caller's side, so that bad input
fails in ``submit`` and never in a step."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Sequence

import torch

from .backend import SamplingParams
from .constraints import TokenConstraint
from .output import TextOutput
from .request import Request
from .sampling import RowSampler


class Intake:
    def __init__(self, tokenizer, *, vocab: int, context_window: int, eos_ids: frozenset[int],
                 device: torch.device) -> None:
        self.tokenizer = tokenizer
        self.vocab = vocab
        self.context_window = context_window
        self.eos_ids = eos_ids
        self.device = device
        self._ids = itertools.count(1)

    def prompt(self, prompt_ids: Sequence[int]) -> list[int]:
        prompt = [int(t) for t in prompt_ids]
        if not prompt:
            raise ValueError("empty prompt")
        bad = [t for t in prompt if t < 0 or t >= self.vocab]
        if bad:
            raise ValueError(f"token ids out of the vocabulary (0..{self.vocab - 1}): {bad[:5]}")
        if len(prompt) >= self.context_window:
            raise ValueError(
                f"prompt of {len(prompt)} tokens does not fit the context window of {self.context_window} tokens"
            )
        return prompt

    def generation(self, prompt_ids: Sequence[int], params: SamplingParams, loop: asyncio.AbstractEventLoop, *,
                   conversation_id: str | None, constraint: TokenConstraint | None, background: bool) -> Request:
        prompt = self.prompt(prompt_ids)
        if params.max_tokens < 1:
            raise ValueError("max_tokens must be >= 1")
        req = Request(f"gen-{next(self._ids)}", prompt, params, conversation_id, loop, background=background)
        req.max_new = min(params.max_tokens, self.context_window - len(prompt))
        req.sampler = RowSampler(
            temperature=params.temperature, top_p=params.top_p, top_k=params.top_k,
            repetition_penalty=params.repetition_penalty, seed=params.seed, prompt_ids=prompt,
            device=self.device, suppress_ids=tuple(sorted(self.eos_ids)) if params.ignore_eos else (),
            presence_penalty=params.presence_penalty, frequency_penalty=params.frequency_penalty, constraint=constraint,
            probe_ids=params.probe_ids,
        )
        req.output = TextOutput(self.tokenizer, stop=params.stop, max_new=req.max_new,
                                eos_ids=frozenset() if params.ignore_eos else self.eos_ids)
        return req

    def prefill(self, prompt_ids: Sequence[int], loop: asyncio.AbstractEventLoop, *, conversation_id: str,
                background: bool) -> Request:
        prompt = self.prompt(prompt_ids)
        return Request(f"pre-{next(self._ids)}", prompt, None, conversation_id, loop, background=background)
