"""POST /v1/chat/completions (plain JSON or SSE) and GET /v1/models. The completion itself is
generation/chat_run.py; a stream is resumable with Last-Event-ID (stream_hub.py)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from pydantic import ValidationError

from gateway.api.caller import AuthorizedCaller
from gateway.api.http_bodies import read_json_object
from gateway.api.idempotent import idempotent
from gateway.api.openapi import error_responses, json_body
from gateway.api.services import Services, services
from gateway.api.sse import DONE, resume_stream, sse_data, sse_response, stream_request
from gateway.generation.chat_run import ChatRun
from gateway.protocol.chat import ChatCompletionRequest
from gateway.protocol.validation import api_error_from_validation

router = APIRouter()


def model_object(model_id: str) -> dict[str, Any]:
    return {"id": model_id, "object": "model", "created": 0, "owned_by": "realtime-gateway"}


@router.get("/v1/models", responses=error_responses(401, 429))
async def list_models(request: Request, caller: AuthorizedCaller) -> JSONResponse:
    svc = services(request)
    listed = svc.runtime.model_names.listed
    return JSONResponse({"object": "list", "data": [model_object(name) for name in listed]}, headers=caller.headers)


@router.get("/v1/models/{model_id:path}", responses=error_responses(401, 404, 429))
async def get_model(model_id: str, request: Request, caller: AuthorizedCaller) -> JSONResponse:
    svc = services(request)
    svc.runtime.require_model(model_id, "model_id")
    return JSONResponse(model_object(model_id), headers=caller.headers)


@router.post(
    "/v1/chat/completions",
    openapi_extra=json_body(ChatCompletionRequest),
    responses=error_responses(400, 401, 404, 409, 413, 422, 429, 503),
)
async def chat_completions(request: Request, caller: AuthorizedCaller) -> Response:
    svc = services(request)
    if (resumed := await resume_stream(svc, request, caller)) is not None:
        return resumed
    body, payload = await read_json_object(request)
    try:
        chat = ChatCompletionRequest.model_validate(payload)
    except ValidationError as exc:
        raise api_error_from_validation(exc) from None
    svc.runtime.require_model(chat.model)
    svc.runtime.require_ready()
    return await idempotent(svc, request, caller.key_id, body, caller.headers,
                            lambda: _complete(svc, chat, caller.headers, request, caller.key_id))


async def _complete(svc: Services, chat: ChatCompletionRequest, headers: dict[str, str], request: Request,
                    owner: str) -> Response:
    run = await ChatRun.prepare(svc.run_deps(owner), chat, owner, getattr(request.state, "request_id", None))
    headers = {**headers, **run.reservation_headers}
    if not chat.stream:
        return JSONResponse(await run.complete(), headers=headers)
    buffer = svc.stores.streams.start(run.id, owner, _sse(run), request=await stream_request(request),
                                      runs_to_end=run.runs_to_end)
    run.record.read_now = buffer.read_now
    return sse_response(svc.stores.streams.read(buffer), headers)


async def _sse(run: ChatRun) -> AsyncIterator[bytes]:
    # aclosing: a client that leaves closes this stream, and so the run's, which frees the engine slot at once.
    async with contextlib.aclosing(run.chunks()) as chunks:
        async for chunk in chunks:
            yield sse_data(chunk)
    if not run.failed:
        yield DONE
