"""The streaming conversation API of the seeds over HTTP: POST /backend-api/conversation/{id}/messages answers
over SSE with `delta_encoding: v1` JSON-pointer patches, and POST .../prepare pre-warms the draft being typed.
The use case is generation/conversation_run.py; here are the bodies, the screening and the stream's SSE.

A message goes under `parent_message_id` (default: the current leaf; null: a new root), so editing a
message or regenerating a reply (no `content`: a new answer to a user message) makes a sibling branch.
The reply is stored as it streams and runs to its end even if the client leaves; `Last-Event-ID`
(the stream's resume token, in every event's id) resumes the stream on the same URL.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field

from gateway.api.caller import AuthorizedCaller
from gateway.api.http_bodies import read_model
from gateway.api.openapi import error_responses, json_body
from gateway.api.services import services
from gateway.api.sse import DONE, resume_stream, sse_data, sse_response, stream_request
from gateway.generation.conversation_run import ConversationRun, prepare_draft
from gateway.safety.screening import screen_text

router = APIRouter()
MAX_CONTENT_CHARS = 100_000


class PostMessage(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")
    model: str = Field(min_length=1, max_length=256)
    content: str | None = Field(None, min_length=1, max_length=MAX_CONTENT_CHARS,
                                description="The user's message. Omitted: a new reply to parent_message_id, which "
                                "must be a user message (regenerate).")
    parent_message_id: str | None = Field(None, max_length=64, description="The message this one follows. Default: "
                                          "the current leaf; null: a new first message (editing the first one).")
    max_tokens: int | None = Field(None, ge=1, le=32768)
    temperature: float | None = Field(None, ge=0, le=2)


class PrepareMessage(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")
    content: str = Field(min_length=1, max_length=MAX_CONTENT_CHARS, description="The draft being typed.")
    parent_message_id: str | None = Field(None, max_length=64, description="As in POST .../messages.")


@router.post("/backend-api/conversation/{conversation_id}/messages", openapi_extra=json_body(PostMessage),
             responses=error_responses(400, 401, 404, 413, 422, 429, 503))
async def post_message(request: Request, caller: AuthorizedCaller, conversation_id: str) -> Response:
    svc = services(request)
    if (resumed := await resume_stream(svc, request, caller)) is not None:
        return resumed
    body: PostMessage = await read_model(request, PostMessage)
    svc.runtime.require_model(body.model)
    deps = svc.run_deps(caller.key_id)
    content = screen_text(deps.generator.safety, body.content, what="message", param="content") if body.content else None
    run = await ConversationRun.start(deps, svc.stores.prewarmer, caller.key_id, conversation_id, content=content,
                                      parent_given="parent_message_id" in body.model_fields_set,
                                      parent_message_id=body.parent_message_id, max_tokens=body.max_tokens,
                                      temperature=body.temperature, model=body.model)
    buffer = svc.stores.streams.start(run.stream_id, caller.key_id, _sse(run), request=await stream_request(request),
                                      runs_to_end=True)
    return sse_response(svc.stores.streams.read(buffer), {**caller.headers, **run.reservation_headers})


async def _sse(run: ConversationRun) -> AsyncIterator[bytes]:
    async for payload, event in run.events():
        yield sse_data(payload, event)
    if run.completed:
        yield DONE


@router.post("/backend-api/conversation/{conversation_id}/prepare", status_code=202, openapi_extra=json_body(PrepareMessage),
             responses=error_responses(400, 401, 404, 413, 422, 429, 503))
async def prepare(request: Request, caller: AuthorizedCaller, conversation_id: str) -> JSONResponse:
    """The user is typing: prefill the conversation and the draft, so the reply to it starts sooner."""
    svc = services(request)
    body: PrepareMessage = await read_model(request, PrepareMessage)
    deps = svc.run_deps(caller.key_id)
    draft = screen_text(deps.generator.safety, body.content, what="draft", param="content")  # the model prefills it
    prompt_tokens = await prepare_draft(deps, svc.stores.prewarmer, caller.key_id, conversation_id, draft,
                                        "parent_message_id" in body.model_fields_set, body.parent_message_id)
    return JSONResponse({"object": "conversation.prepare", "conversation_id": conversation_id,
                         "prompt_tokens": prompt_tokens}, status_code=202, headers=caller.headers)
