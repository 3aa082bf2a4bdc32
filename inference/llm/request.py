"""A request inside the engine, and its status (vLLM v1's ``request.py`` seam).

A request moves WAITING -> PREFILLING -> DECODING -> FINISHED; a prefill-only request (the KV of a
conversation computed ahead of its reply) has no sampling parameters and finishes when its prompt's
KV exists. Only the scheduler thread changes ``status``; ``cancel_requested`` is the one field
another thread writes (a stream's cancel), and the scheduler acts on it at the next step boundary.
"""

from __future__ import annotations

import asyncio
import enum
import time

from .backend import FinishReason, GenerationResult, GenerationStream, SamplingParams
from .kv_manager import SlotHandle
from .output import TextOutput
from .sampling import RowSampler


class RequestStatus(enum.Enum):
    WAITING = "waiting"        # queued, no KV slot
    PREFILLING = "prefilling"  # holds a slot; its prompt's KV is being computed
    DECODING = "decoding"      # samples one token a step
    FINISHED = "finished"      # ended (any reason); its slot is free


class Request:
    __slots__ = (
        "id", "status", "prompt", "params", "conversation_id", "stream", "future", "loop", "tokens",
        "kv", "cached", "generated", "sampler", "output", "emitted_text", "cancel_requested",
        "submitted_at", "first_token_at", "max_new", "admitted_at", "cancel_at", "waited_for_prefix",
        "background", "not_needed_before",
    )

    def __init__(self, rid: str, prompt: list[int], params: SamplingParams | None, conversation_id: str | None,
                 loop: asyncio.AbstractEventLoop, *, background: bool = False) -> None:
        self.id = rid
        self.status = RequestStatus.WAITING
        self.prompt = prompt
        self.params = params  # None: prefill only
        self.conversation_id = conversation_id
        self.loop = loop
        self.background = background  # admitted only when no live request waits, one at a time
        self.stream: GenerationStream | None = None
        self.future: asyncio.Future[int] | None = None
        self.tokens: list[int] = list(prompt)  # prompt + generated
        self.kv: SlotHandle | None = None  # the KV slot while running
        self.cached = 0  # prompt tokens reused from the prefix cache
        self.generated: list[int] = []
        self.sampler: RowSampler | None = None
        self.output: TextOutput | None = None  # its text from its tokens, and why it ends
        self.emitted_text: list[str] = []
        self.cancel_requested = False
        self.cancel_at = 0.0
        self.submitted_at = time.monotonic()
        self.admitted_at = 0.0
        self.first_token_at: float | None = None
        self.max_new = 0
        self.waited_for_prefix = False  # held in the queue for another request's prefill of a shared prefix
        # Its reader needs no token before this time.monotonic() (GenerationStream.pace): the scheduler
        # leaves it out of steps shared with requests needed sooner. Written by the event loop only.
        self.not_needed_before = 0.0

    @property
    def generates(self) -> bool:
        """Whether it samples tokens (False: a prefill-only request)."""
        return self.params is not None

    @property
    def finished(self) -> bool:
        return self.status is RequestStatus.FINISHED

    @property
    def prefix_limit(self) -> int:
        """How much of the prompt may come from the cache: a generation computes at least its last
        prompt token, whose logits give the first token."""
        return len(self.prompt) - 1 if self.generates else len(self.prompt)

    def accept(self, token: int, now: float) -> tuple[str, FinishReason | None]:
        """Its next token, sampled: the text to send now, and why it ends if this token ends it."""
        assert self.sampler is not None and self.output is not None
        if self.first_token_at is None:
            self.first_token_at = now
        self.generated.append(token)
        self.tokens.append(token)
        self.sampler.observe(token)
        return self.output.accept(token, len(self.generated))

    def result(self, reason: FinishReason, now: float) -> GenerationResult:
        return GenerationResult(
            text="".join(self.emitted_text),
            token_ids=list(self.generated),
            finish_reason=reason,
            prompt_tokens=len(self.prompt),
            completion_tokens=len(self.generated),
            cached_prompt_tokens=self.cached,
            submitted_at=self.submitted_at,
            first_token_at=self.first_token_at,
            finished_at=now,
            first_step_probability=self.sampler.probed if self.sampler is not None else None,
            admitted_at=self.admitted_at or None,
        )
