"""POST /v1/completions: text or token-id prompts, plain JSON or SSE.

This is how one gateway is the LLM engine of others (``--llm-backend URL`` with the token flavour,
inference/llm/remote.py), and how a cache-aware router fronts several of them: the front gateway renders
the prompt, this one runs it on its engine, whose prefix cache matches token ids exactly. A client that
leaves (a barge-in closes the connection) cancels its request at the next step.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from typing import Any, cast

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from gateway.api.caller import AuthorizedCaller
from gateway.api.http_bodies import read_model
from gateway.api.openapi import error_responses, json_body
from gateway.api.services import services
from gateway.api.sse import DONE, sse_data, sse_response
from gateway.generation.service import Rendered, Reply
from gateway.platform import metrics
from gateway.platform.event_log import log_event
from gateway.platform.token_quota import TokenAccount
from gateway.protocol.chat import usage_object
from gateway.protocol.completions import (
    DEFAULT_MAX_TOKENS,
    CompletionRequest,
    completion_choice,
    text_completion,
    text_completion_id,
)
from gateway.protocol.errors import ApiError
from gateway.safety.output import CLASSIFIER, OutputGuard, guarded
from gateway.safety.policy import SafetyPolicy
from gateway.safety.screening import screen_text
from inference.llm.backend import GenerationResult, PromptModel
from inference.llm.chat import RenderedPrompt

log = logging.getLogger(__name__)
router = APIRouter()


@router.post("/v1/completions", openapi_extra=json_body(CompletionRequest),
             responses=error_responses(400, 401, 404, 413, 422, 429, 503))
async def completions(request: Request, caller: AuthorizedCaller) -> Response:
    svc = services(request)
    body = await read_model(request, CompletionRequest)
    svc.runtime.require_model(body.model)
    generator = svc.runtime.generator()
    engine = generator.engine
    policy = svc.runtime.safety
    prompt = cast("str | list[int]", body.prompt)  # its validator leaves one prompt, text or ids
    prompt_ids, prompt_text = await asyncio.to_thread(_screened_prompt, engine.lm, policy, prompt)
    room = engine.lm.context_window - len(prompt_ids)
    if room < 1:
        raise ApiError("context_length_exceeded", f"The prompt has {len(prompt_ids)} tokens; the model's context "
                       f"window is {engine.lm.context_window}.", "prompt")
    max_tokens = min(body.max_tokens or DEFAULT_MAX_TOKENS, room)
    sampling = body.sampling(max_tokens, svc.settings.repetition_penalty, ignore_eos=body.ignore_eos)
    # 429 past --rate-limit-tpm; a token id past the vocabulary is the prompt's invalid_value
    prepared = await generator.reserve(Rendered(RenderedPrompt(prompt_ids)), sampling,
                                       TokenAccount(svc.gate.quota, caller.key_id), invalid_param="prompt")
    headers = caller.headers
    if prepared.reservation is not None:
        headers = {**headers, **prepared.reservation.headers()}
    stream = await generator.start(prepared)
    # The rules on the output as it streams, and the classifier beside it (on the prompt at once).
    guard = generator.guard(stream.cancel)
    guard.start(prompt_text)
    cid = text_completion_id()
    request_id = getattr(request.state, "request_id", None)
    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        return sse_response(_sse(stream, guard, cid, body.model, include_usage, request_id), headers)
    result: GenerationResult | None = None
    parts: list[str] = []
    try:
        async for text in guarded(stream, guard):
            parts.append(text)
        result = await stream.result()
    finally:
        await stream.close()  # frees the slot if the client went away; settles the tokens
        await guard.close()
    _record(request_id, cid, body.model, False, result)
    # A reply the classifier flagged is withheld whole (a rule's match keeps the text before it).
    text = "" if guard.blocked is CLASSIFIER else "".join(parts)
    return JSONResponse(text_completion(cid, body.model, None, [completion_choice(text, _finish(result, guard))],
                                        _usage(result)), headers=headers)


def _screened_prompt(lm: PromptModel, policy: SafetyPolicy, prompt: str | list[int]) -> tuple[list[int], str]:
    """The prompt's token ids after the input policy, and its text (blocking: run it in a thread). A token-id
    prompt is read as its text; when the policy redacts that, the redacted text is tokenized again."""
    tokenizer = lm.tokenizer
    if isinstance(prompt, str):
        text = screen_text(policy, prompt, what="prompt", param="prompt")
        return list(tokenizer(text)["input_ids"]), text
    if not policy:
        return prompt, ""
    try:
        text = cast(str, tokenizer.decode(prompt))
    except (OverflowError, TypeError, ValueError):
        raise ApiError("invalid_value", "The prompt holds a token id past the model's vocabulary.", "prompt") from None
    screened = screen_text(policy, text, what="prompt", param="prompt")
    if screened == text:
        return prompt, text
    return list(tokenizer(screened, add_special_tokens=False)["input_ids"]), screened


def _finish(result: GenerationResult, guard: OutputGuard) -> str:
    if guard.blocked is not None:
        return "content_filter"
    return "length" if result.finish_reason == "length" else "stop"


def _usage(result: GenerationResult) -> dict[str, Any]:
    return usage_object(result.prompt_tokens, result.completion_tokens, result.cached_prompt_tokens)


def _record(request_id: str | None, cid: str, model: str, stream: bool, result: GenerationResult | None,
            status: str = "completed") -> None:
    if result is not None and result.first_token_at is not None:
        metrics.COMPLETIONS_TTFT_SECONDS.observe(result.first_token_at - result.submitted_at)
    if result is not None and result.admitted_at is not None:
        metrics.QUEUE_WAIT_SECONDS.labels("completions").observe(result.admitted_at - result.submitted_at)
    tokens: dict[str, Any] = {"input_tokens": result.prompt_tokens, "cached_tokens": result.cached_prompt_tokens,
              "output_tokens": result.completion_tokens, "finish_reason": result.finish_reason} if result else {}
    log_event("completion", request_id=request_id, completion_id=cid, model=model, stream=stream, status=status,
              **tokens)


async def _sse(stream: Reply, guard: OutputGuard, cid: str, model: str, include_usage: bool,
               request_id: str | None) -> AsyncIterator[bytes]:
    created = int(time.time())
    status = "cancelled"
    try:
        async for text in guarded(stream, guard):
            yield sse_data(text_completion(cid, model, created, [completion_choice(text, None)]))
        result = await stream.result()
        yield sse_data(text_completion(cid, model, created, [completion_choice("", _finish(result, guard))]))
        if include_usage:
            yield sse_data(text_completion(cid, model, created, [], _usage(result)))
        status = "completed"
        _record(request_id, cid, model, True, result)
        yield DONE
    except ApiError as exc:  # headers are gone: the error travels in the stream
        status = "failed"
        yield sse_data({"error": exc.body()})
    finally:
        # Runs when the client disconnects too (the generator is closed): the engine stops the request.
        await stream.close()
        await guard.close()
        if status != "completed":
            _record(request_id, cid, model, True, None, status)
