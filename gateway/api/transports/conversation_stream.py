"""The streaming conversation API of the seeds: POST /backend-api/conversation/{id}/messages answers over SSE
with `delta_encoding: v1` JSON-pointer patches, and POST .../prepare pre-warms the draft being typed.

A message goes under `parent_message_id` (default: the current leaf; null: a new root), so editing a
message or regenerating a reply (no `content`: a new answer to a user message) makes a sibling branch.
The reply is stored as it streams and runs to its end even if the client leaves; `Last-Event-ID`
(the stream's resume token, in every event's id) resumes the stream on the same URL.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field

from gateway.api.caller import AuthorizedCaller
from gateway.api.http_bodies import read_model
from gateway.api.openapi import error_responses, json_body
from gateway.api.services import Services, services
from gateway.api.sse import DONE, resume_stream, sse_data, sse_response, stream_request
from gateway.generation.chat_history import chat_message
from gateway.generation.chat_plan import ReplyForm
from gateway.generation.memory import Recall
from gateway.generation.reply_path import PromptFields, ReplyPath, ReplyRequest
from gateway.generation.service import Reply
from gateway.generation.titles import generate_title
from gateway.platform.storage.conversations import MessageStatus, NewMessage
from gateway.platform.storage.schema import ConversationRow
from gateway.platform.storage.writer import MessageWriter
from gateway.platform.token_quota import TokenAccount
from gateway.protocol.chat import completion_id
from gateway.protocol.errors import ApiError
from gateway.safety.output import OutputGuard, guarded
from gateway.safety.screening import screen_text
from inference.llm.backend import LLMBackend, SamplingParams
from inference.llm.chat import ChatMessage

log = logging.getLogger(__name__)
router = APIRouter()
MAX_CONTENT_CHARS = 100_000
TEXT_PATH = "/message/content/parts/0"


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


@dataclass
class Turn:
    conversation: ConversationRow
    parent_id: str | None  # where the new message (or the regenerated reply) goes
    messages: list[ChatMessage]  # the prompt: the branch up to the parent, then the new message
    new_user: NewMessage | None  # stored with the reply; None when regenerating


async def _resolve(svc: Services, owner: str, conversation_id: str, content: str | None, parent_given: bool,
                   parent_message_id: str | None) -> Turn:
    conversation = await svc.stores.store.get(owner, conversation_id)
    parent = parent_message_id if parent_given else conversation.current_leaf_id
    rows = await svc.stores.store.branch(conversation, parent) if parent is not None else []
    if parent is not None and (not rows or rows[-1].id != parent):
        raise ApiError("message_not_found", f"No message '{parent}' in this conversation.", "parent_message_id",
                       status=404)
    history = [chat_message(row) for row in rows]
    if content is None:
        if not rows or rows[-1].role != "user":
            raise ApiError("invalid_value", "Without content the reply is regenerated, so parent_message_id must be "
                           "a user message.", "parent_message_id")
        return Turn(conversation, parent, history, None)
    user = NewMessage(role="user", content=[{"type": "text", "text": content}])
    return Turn(conversation, parent, [*history, ChatMessage("user", content)], user)


def _reply_request(svc: Services, turn: Turn, max_tokens: int, *, save: bool,
                   temperature: float | None = None) -> ReplyRequest:
    """A turn's reply: no tools of the client's (with the key's memory on, the model may save memories).
    `save`: the turn's question is saved when it asks to be remembered (not a draft's, not a regenerated one's)."""
    sampling = SamplingParams(temperature=0.7 if temperature is None else temperature,
                              repetition_penalty=svc.settings.repetition_penalty, max_tokens=max_tokens)
    return ReplyRequest(turn.messages, ReplyForm([]), sampling, PromptFields(context="content"),
                        save_memory=save)


@router.post("/backend-api/conversation/{conversation_id}/messages", openapi_extra=json_body(PostMessage),
             responses=error_responses(400, 401, 404, 413, 422, 429, 503))
async def post_message(request: Request, caller: AuthorizedCaller, conversation_id: str) -> Response:
    svc = services(request)
    if (resumed := await resume_stream(svc, request, caller)) is not None:
        return resumed
    body: PostMessage = await read_model(request, PostMessage)
    svc.runtime.require_model(body.model)
    generator = svc.runtime.generator()
    content = screen_text(svc.runtime.safety, body.content, what="message", param="content") if body.content else None
    turn = await _resolve(svc, caller.key_id, conversation_id, content,
                          "parent_message_id" in body.model_fields_set, body.parent_message_id)
    reply_request = _reply_request(svc, turn, body.max_tokens or svc.settings.default_max_tokens,
                                   save=content is not None, temperature=body.temperature)
    # 429 past --rate-limit-tpm
    path = await ReplyPath.prepare(generator, reply_request, memory=svc.memory(caller.key_id),
                                   tokens=TokenAccount(svc.gate.quota, caller.key_id))
    prewarmed = svc.stores.prewarmer.prepared_tokens(caller.key_id, conversation_id, path.prompt_ids)
    headers = caller.headers
    if path.reservation is not None:
        headers = {**headers, **path.reservation.headers()}
    stream = await path.start(routing_key=conversation_id)
    # The rules on the reply as it streams, and the classifier beside it.
    guard = generator.guard(stream.cancel)
    reply = NewMessage(role="assistant", content=[], status="in_progress", model=body.model)
    writer = MessageWriter(svc.stores.store, turn.conversation.id, turn.parent_id,
                           [turn.new_user] if turn.new_user is not None else [], reply)
    stream_id = completion_id().replace("chatcmpl-", "strm_")
    title_for = content if turn.conversation.title is None and turn.new_user is not None else None
    events = _events(svc, caller.key_id, stream_id, turn, stream, guard, writer, prewarmed, title_for,
                     path.remembered)
    buffer = svc.stores.streams.start(stream_id, caller.key_id, events, request=await stream_request(request),
                               runs_to_end=True)
    return sse_response(svc.stores.streams.read(buffer), headers)


async def _events(svc: Services, owner: str, stream_id: str, turn: Turn, stream: Reply, guard: OutputGuard,
                  writer: MessageWriter, prepared_tokens: int, title_for: str | None,
                  remembered: Recall | None) -> AsyncIterator[bytes]:
    conversation_id = turn.conversation.id
    guard.start(next((m.content for m in reversed(turn.messages) if m.role == "user"), ""))  # classified at once
    try:
        yield sse_data("v1", "delta_encoding")
        yield sse_data({"type": "resume_conversation_token", "token": stream_id, "conversation_id": conversation_id})
        message = {"id": writer.reply.id, "author": {"role": "assistant"}, "content": {"content_type": "text",
                   "parts": [""]}, "status": "in_progress", "metadata": {"parent_id": turn.new_user.id if turn.new_user
                   else turn.parent_id, "model": writer.reply.model}}
        yield sse_data({"p": "", "o": "add", "v": {"message": message, "conversation_id": conversation_id,
                                                "input_message_id": turn.new_user.id if turn.new_user else None}},
                    "delta")
        first = True
        async for safe in guarded(stream, guard):
            writer.append(safe)
            yield sse_data({"p": TEXT_PATH, "o": "append", "v": safe} if first else {"v": safe}, "delta")
            first = False
        result = await stream.result()
        finish_reason = "content_filter" if guard.blocked is not None else result.finish_reason
        status: MessageStatus = "incomplete" if finish_reason in ("length", "content_filter") else "completed"
        usage: dict[str, Any] = {"input_tokens": result.prompt_tokens, "cached_tokens": result.cached_prompt_tokens,
                                 "output_tokens": result.completion_tokens}
        latency = {"ttft_ms": None if result.first_token_at is None else
                   round((result.first_token_at - result.submitted_at) * 1000, 1)}
        memories = remembered.metadata() if remembered is not None else None
        writer.finish(status, latency=latency, message_metadata=memories, **usage)
        metadata = {"finish_reason": finish_reason, "usage": usage, **latency, **(memories or {}),
                    "prewarmed": prepared_tokens > 0 and result.cached_prompt_tokens >= prepared_tokens}
        yield sse_data({"p": "", "o": "patch", "v": [{"p": "/message/status", "o": "replace", "v": status},
                                                  {"p": "/message/metadata", "o": "append", "v": metadata}]}, "delta")
        await writer.written()
        if title_for is not None and (title := await _title(svc, owner, conversation_id, title_for)):
            yield sse_data({"type": "title_generation", "title": title, "conversation_id": conversation_id})
        yield DONE
    except asyncio.CancelledError:  # the server is shutting down
        writer.finish("cancelled")
        raise
    except Exception as exc:  # headers are gone: the error travels in the stream
        log.exception("conversation stream %s failed", stream_id)
        writer.finish("incomplete", error="the generation failed")
        yield sse_data({"type": "error", "error": {"message": str(exc), "type": "server_error", "code": "internal_error"}})
        yield sse_data({"p": "", "o": "patch", "v": [{"p": "/message/status", "o": "replace", "v": "incomplete"}]},
                    "delta")
    finally:
        await stream.close()  # settles the tokens
        await guard.close()
        # Only now: the reply's KV extends the prepared prefix, which an earlier unpin would have dropped.
        svc.stores.prewarmer.release(stream_engine(svc), owner, conversation_id)


def stream_engine(svc: Services) -> LLMBackend:
    assert svc.runtime.engine is not None
    return svc.runtime.engine


async def _title(svc: Services, owner: str, conversation_id: str, question: str) -> str | None:
    title = await generate_title(svc.runtime.generator(), question, conversation_id)
    if title is not None:
        await svc.stores.store.update(owner, conversation_id, title=title)
    return title


@router.post("/backend-api/conversation/{conversation_id}/prepare", status_code=202, openapi_extra=json_body(PrepareMessage),
             responses=error_responses(400, 401, 404, 413, 422, 429, 503))
async def prepare(request: Request, caller: AuthorizedCaller, conversation_id: str) -> JSONResponse:
    """The user is typing: prefill the conversation and the draft, so the reply to it starts sooner."""
    svc = services(request)
    body: PrepareMessage = await read_model(request, PrepareMessage)
    generator = svc.runtime.generator()
    draft = screen_text(svc.runtime.safety, body.content, what="draft", param="content")  # the model prefills it
    turn = await _resolve(svc, caller.key_id, conversation_id, draft,
                          "parent_message_id" in body.model_fields_set, body.parent_message_id)
    # The message's prompt as it will be, with no tokens reserved: nothing is generated.
    path = await ReplyPath.prepare(generator, _reply_request(svc, turn, svc.settings.default_max_tokens, save=False),
                                   memory=svc.memory(caller.key_id))
    svc.stores.prewarmer.prepare(generator.engine, caller.key_id, conversation_id, path.prompt_ids)
    return JSONResponse({"object": "conversation.prepare", "conversation_id": conversation_id,
                         "prompt_tokens": len(path.prompt_ids)}, status_code=202, headers=caller.headers)
