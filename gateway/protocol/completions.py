"""(Legacy) Completions: the request model and response shapes of `POST /v1/completions`, as OpenAI,
vLLM and SGLang serve it. Its prompt may be token ids, which is how another gateway (or any client that
renders its own prompts) uses this one as its LLM engine."""

from __future__ import annotations

import secrets
import time
from typing import Any, Literal

from pydantic import Field, field_validator

from gateway.protocol.chat import INT32_MAX, SamplingRequest

DEFAULT_MAX_TOKENS = 16  # OpenAI's (and vLLM's) default for this endpoint
MAX_PROMPT_CHARS = 1 << 20


class CompletionRequest(SamplingRequest):
    # One prompt: text, or token ids (a batch of one is accepted in either form: ["..."], [[1, 2]]).
    prompt: str | list[int] | list[str] | list[list[int]]
    # Refused unless left at OpenAI's defaults (strict types: only that value passes), never ignored.
    echo: Literal[False] = False
    best_of: int | None = Field(None, ge=1, le=1)
    logprobs: None = None
    logit_bias: None = None
    suffix: None = None
    # vLLM's and SGLang's extension (benchmarks: a fixed number of tokens).
    ignore_eos: bool = False

    @field_validator("prompt")
    @classmethod
    def _one_prompt(cls, prompt: Any) -> str | list[int]:
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
            if len(prompt) != 1:
                raise ValueError("one prompt per request (n and batches of prompts are not served)")
            prompt = prompt[0]
        if isinstance(prompt, str):
            if not prompt or len(prompt) > MAX_PROMPT_CHARS:
                raise ValueError(f"the prompt must have 1 to {MAX_PROMPT_CHARS} characters")
        elif not prompt or any(not 0 <= token <= INT32_MAX for token in prompt):
            raise ValueError("token ids must be a non-empty list of non-negative integers")
        return prompt


def text_completion_id() -> str:
    return "cmpl-" + secrets.token_hex(12)


def completion_choice(text: str, finish_reason: str | None) -> dict[str, Any]:
    return {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}


def text_completion(cid: str, model: str, created: int | None, choices: list[dict[str, Any]],
                    usage: dict[str, Any] | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"id": cid, "object": "text_completion", "created": created or int(time.time()),
                            "model": model, "choices": choices}
    if usage is not None:
        body["usage"] = usage
    return body
