"""POST /v1/chat/completions (plain JSON or SSE) and GET /v1/models."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import ValidationError

from gateway import metrics
from gateway.http_bodies import read_json_object
from gateway.idempotency import StoredResponse
from gateway.openapi import error_responses, json_body
from gateway.protocol.chat import ChatCompletionRequest, chunk_object, completion_id, completion_object, usage_object
from gateway.protocol.errors import ApiError, overloaded
from gateway.protocol.validation import api_error_from_validation
from gateway.services import Services
from inference.llm.chat import ContextOverflow, render_prompt
from inference.llm.engine import EngineOverloaded, GenerationStream, SamplingParams

log = logging.getLogger(__name__)
router = APIRouter()


def services(request: Request) -> Services:
    return request.app.state.services  # type: ignore[no-any-return]


def model_object(model_id: str) -> dict[str, Any]:
    return {"id": model_id, "object": "model", "created": 0, "owned_by": "realtime-gateway"}


@router.get("/v1/models", responses=error_responses(401, 429))
async def list_models(request: Request) -> JSONResponse:
    svc = services(request)
    _, headers = svc.authorize(request.headers.get("authorization"))
    listed = svc.runtime.model_names.listed
    return JSONResponse({"object": "list", "data": [model_object(name) for name in listed]}, headers=headers)


@router.get("/v1/models/{model_id:path}", responses=error_responses(401, 404, 429))
async def get_model(model_id: str, request: Request) -> JSONResponse:
    svc = services(request)
    _, headers = svc.authorize(request.headers.get("authorization"))
    svc.require_model(model_id, "model_id")
    return JSONResponse(model_object(model_id), headers=headers)


@router.post(
    "/v1/chat/completions",
    openapi_extra=json_body(ChatCompletionRequest),
    responses=error_responses(400, 401, 404, 409, 413, 422, 429, 503),
)
async def chat_completions(request: Request) -> Response:
    svc = services(request)
    principal, headers = svc.authorize(request.headers.get("authorization"))
    body, payload = await read_json_object(request)
    try:
        chat = ChatCompletionRequest.model_validate(payload)
    except ValidationError as exc:
        raise api_error_from_validation(exc) from None
    svc.require_model(chat.model)
    svc.require_ready()

    idempotency_key = request.headers.get("idempotency-key")
    if idempotency_key:
        stored = svc.idempotency.begin(principal.key_id, idempotency_key, body)
        if stored is not None:
            return Response(stored.body, stored.status, {**stored.headers, "idempotent-replayed": "true"}, stored.media_type)

    try:
        response = await _complete(svc, chat, headers, request)
    except BaseException:
        if idempotency_key:
            svc.idempotency.finish(principal.key_id, idempotency_key, None)
        raise
    if idempotency_key and not isinstance(response, StreamingResponse):
        svc.idempotency.finish(
            principal.key_id,
            idempotency_key,
            StoredResponse(response.status_code, "application/json", bytes(response.body), headers),
        )
    elif idempotency_key:
        # A stream cannot be replayed byte for byte once sent; a retry after it runs again.
        svc.idempotency.finish(principal.key_id, idempotency_key, None)
    return response


async def _complete(svc: Services, chat: ChatCompletionRequest, headers: dict[str, str], request: Request) -> Response:
    engine = svc.runtime.engine
    assert engine is not None
    max_tokens = chat.wanted_max_tokens() or svc.settings.default_max_tokens
    try:
        prompt = await asyncio.to_thread(
            render_prompt,
            engine.lm.tokenizer,
            [message.to_chat() for message in chat.messages],
            context_window=engine.lm.context_window,
            reserve_tokens=max_tokens,
            tools=chat.tools,
        )
    except ContextOverflow as exc:
        raise ApiError("context_length_exceeded", str(exc), "messages") from None
    sampling = SamplingParams(
        temperature=1.0 if chat.temperature is None else chat.temperature,
        top_p=chat.top_p or 1.0,
        top_k=chat.top_k or 0,
        repetition_penalty=chat.repetition_penalty or svc.settings.repetition_penalty,
        seed=chat.seed,
        max_tokens=max_tokens,
        stop=tuple(chat.stop or ()),  # type: ignore[arg-type]
    )
    try:
        stream = engine.submit(prompt.token_ids, sampling)
    except EngineOverloaded as exc:
        raise overloaded("The model is at capacity; retry shortly.", exc.retry_after_s) from None
    cid = completion_id()
    fingerprint = f"fp_{svc.settings.model_name}"
    if chat.stream:
        include_usage = bool(chat.stream_options and chat.stream_options.include_usage)
        return StreamingResponse(
            _sse(stream, cid, chat.model, fingerprint, include_usage),
            media_type="text/event-stream",
            headers={**headers, "cache-control": "no-cache"},
        )
    try:
        text = "".join([delta async for delta in stream])
        result = await stream.result()
    finally:
        stream.cancel()  # no-op when finished; frees the slot if the client went away
    if result.first_token_at is not None:
        metrics.CHAT_TTFT_SECONDS.observe(result.first_token_at - result.submitted_at)
    usage = usage_object(result.prompt_tokens, result.completion_tokens, result.cached_prompt_tokens)
    finish = "length" if result.finish_reason == "length" else "stop"
    return JSONResponse(completion_object(cid, chat.model, text, finish, usage, fingerprint), headers=headers)


def _sse_line(payload: dict[str, Any]) -> bytes:
    return f"data: {json.dumps(payload, separators=(',', ':'), ensure_ascii=False)}\n\n".encode()


async def _sse(
    stream: GenerationStream, cid: str, model: str, fingerprint: str, include_usage: bool
) -> AsyncIterator[bytes]:
    created = int(time.time())
    try:
        yield _sse_line(chunk_object(cid, model, created, fingerprint, delta={"role": "assistant", "content": ""}))
        async for delta in stream:
            yield _sse_line(chunk_object(cid, model, created, fingerprint, delta={"content": delta}))
        result = await stream.result()
        finish = "length" if result.finish_reason == "length" else "stop"
        yield _sse_line(chunk_object(cid, model, created, fingerprint, delta={}, finish_reason=finish))
        if result.first_token_at is not None:
            metrics.CHAT_TTFT_SECONDS.observe(result.first_token_at - result.submitted_at)
        if include_usage:
            usage = usage_object(result.prompt_tokens, result.completion_tokens, result.cached_prompt_tokens)
            yield _sse_line(chunk_object(cid, model, created, fingerprint, usage=usage))
        yield b"data: [DONE]\n\n"
    except Exception as exc:  # headers are gone: the error travels in the stream, as OpenAI does
        log.exception("chat stream %s failed", cid)
        yield _sse_line({"error": {"message": str(exc), "type": "server_error", "param": None, "code": "internal_error"}})
    finally:
        # Runs when the client disconnects too (the generator is closed): free the engine slot.
        stream.cancel()
