"""POST /v1/chat/completions (plain JSON or SSE) and GET /v1/models."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
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
from gateway.generation.chat_history import AttachedChat
from gateway.generation.chat_plan import ChatPlan, ReplyForm
from gateway.generation.memory import MemoryAccount, MemoryStore, Recall
from gateway.generation.reply_path import PromptFields, ReplyPath, ReplyRequest
from gateway.generation.service import Generator, Reply
from gateway.generation.titles import title_later
from gateway.platform import metrics
from gateway.platform.event_log import log_event
from gateway.platform.storage.conversations import MessageStatus
from gateway.platform.storage.writer import MessageWriter
from gateway.platform.token_quota import TokenAccount
from gateway.protocol.chat import (
    ChatCompletionRequest,
    chunk_object,
    completion_id,
    completion_object,
    usage_object,
)
from gateway.protocol.errors import ApiError
from gateway.protocol.validation import api_error_from_validation
from gateway.safety.output import CLASSIFIER, OutputGuard, guarded, refusal
from gateway.safety.screening import screen_messages
from inference.llm.backend import (
    GenerationResult,
)
from inference.llm.chat import ChatMessage
from inference.llm.tool_calls import ParsedReply, ReplySplitter, parse_reply

log = logging.getLogger(__name__)
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
    last_event_id = request.headers.get("last-event-id")
    if last_event_id is not None:  # a stream's client reconnecting: its body is the same request, not run again
        return await resume_stream(svc, request, last_event_id, caller.key_id, caller.headers)
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
    generator = svc.runtime.generator()
    max_tokens = chat.wanted_max_tokens() or svc.settings.default_max_tokens
    # The policy on the request's user and tool messages (a stored history was screened when it came).
    request_messages = screen_messages(svc.runtime.safety, [message.to_chat() for message in chat.messages])
    attached = await AttachedChat.load(svc.stores.store, owner, chat.conversation) if chat.conversation else None
    base = attached.prompt_messages(request_messages) if attached is not None else list(request_messages)
    sampling = chat.sampling(max_tokens, svc.settings.repetition_penalty)
    reply_request = ReplyRequest(base, ReplyForm.of_chat(chat), sampling,
                                 PromptFields(context="messages", schema="response_format"), question=request_messages)
    memory = MemoryAccount(MemoryStore(svc.stores.store.engine), owner)
    # 429 past --rate-limit-tpm
    path = await ReplyPath.prepare(generator, reply_request, memory=memory, tokens=TokenAccount(svc.gate.quota, owner))
    plan, remembered = path.plan, path.remembered  # remembered: None unless the key opted in
    if path.reservation is not None:
        headers = {**headers, **path.reservation.headers()}
    stream = await path.start(routing_key=chat.conversation)
    cid = completion_id()
    fingerprint = f"fp_{svc.settings.model_name}"
    record = CompletionRecord(getattr(request.state, "request_id", None), cid, chat.model, chat.stream, plan,
                              attached, request_messages, generator=generator, memory=remembered)
    # The rules on the reply as it streams, and the classifier beside it (on the question at once).
    guard = generator.guard(stream.cancel, json_output=_json_reply(chat, path))
    guard.start(next((m.content for m in reversed(request_messages) if m.role == "user"), ""))
    if chat.stream:
        include_usage = bool(chat.stream_options and chat.stream_options.include_usage)
        events = _sse(stream, plan, cid, chat.model, fingerprint, include_usage, record, guard, remembered)
        buffer = svc.stores.streams.start(cid, owner, events, request=await stream_request(request),
                                          runs_to_end=attached is not None)
        record.read_now = buffer.read_now
        return sse_response(svc.stores.streams.read(buffer), headers)
    record.start()
    parts: list[str] = []
    try:
        async for text in guarded(stream, guard):
            parts.append(text)
        # A reply the classifier flagged is withheld whole (a rule's match keeps the text before it).
        text = "" if guard.blocked is CLASSIFIER else "".join(parts)
        result = await stream.result()
    except BaseException as exc:
        record.done("cancelled" if isinstance(exc, asyncio.CancelledError) else "failed")
        raise
    finally:
        await stream.close()  # frees the slot if the client went away; settles the tokens
        await guard.close()
    usage = usage_object(result.prompt_tokens, result.completion_tokens, result.cached_prompt_tokens)
    reply = parse_reply(text, plan.tools) if plan.tools and guard.blocked is None else ParsedReply(text, [])
    finish = "tool_calls" if reply.calls else _finish_reason(result, guard)
    calls = [call.openai() for call in reply.calls] or None
    content, refused = reply.content, refusal(guard.blocked) if guard.blocked is not None else None
    if refused is not None and plan.grammar is not None and not plan.tools:
        content = None  # a JSON reply cut short is not JSON: the refusal says why, as OpenAI's structured outputs
    body = completion_object(cid, chat.model, content, finish, usage, fingerprint, tool_calls=calls, refusal=refused)
    if remembered is not None:
        body["metadata"] = remembered.metadata()
    record.delta(text)
    record.done("completed", result, finish, text, reply=reply)
    await record.stored()
    return JSONResponse(body, headers=headers)


@dataclass
class CompletionRecord:
    """A chat completion's bookkeeping: its metrics, its one `chat.completion` log record (the text only
    with --log-content) and, when it is attached to a conversation, its stored reply."""

    request_id: str | None
    completion_id: str
    model: str
    stream: bool
    plan: ChatPlan
    attached: AttachedChat | None
    request_messages: list[ChatMessage]
    generator: Generator | None = None  # for the title after a conversation's first exchange
    memory: Recall | None = None  # what the key's memory did for it, stored with the reply
    writer: MessageWriter | None = None
    # A stream's: whether a client reads it now. It logs `client_left` when none does as it ends (done or
    # cancelled at the resume window's end); what is stored follows the generation either way.
    read_now: Callable[[], bool] | None = None

    def start(self) -> None:
        """The reply begins: store the request's messages and the reply to come. (Called by a stream when
        it starts: a response the client left before it began stores nothing.)"""
        if self.attached is not None:
            self.writer = self.attached.writer(self.request_messages, self.model)

    async def stored(self) -> None:
        if self.writer is not None:
            await self.writer.written()

    def delta(self, text: str) -> None:
        if self.writer is not None:
            self.writer.append(text)

    def done(self, status: str, result: GenerationResult | None = None, finish_reason: str | None = None,
             text: str | None = None, reply: ParsedReply | None = None) -> None:
        if result is not None and result.first_token_at is not None:
            metrics.CHAT_TTFT_SECONDS.observe(result.first_token_at - result.submitted_at)
        if result is not None and result.admitted_at is not None:
            metrics.QUEUE_WAIT_SECONDS.labels("chat").observe(result.admitted_at - result.submitted_at)
        timings = {"queue_ms": _ms(result.submitted_at, result.admitted_at),
                   "ttft_ms": _ms(result.submitted_at, result.first_token_at),
                   "duration_ms": _ms(result.submitted_at, result.finished_at)} if result else {}
        tokens = {"input_tokens": result.prompt_tokens, "cached_tokens": result.cached_prompt_tokens,
                  "output_tokens": result.completion_tokens} if result else {}
        if self.writer is not None:
            outcomes: dict[str, MessageStatus] = {
                "completed": "incomplete" if finish_reason in ("length", "content_filter") else "completed",
                "cancelled": "cancelled"}
            stored = outcomes.get(status, "incomplete")
            calls = [call.openai() for call in reply.calls] if reply is not None and reply.calls else None
            self.writer.finish(stored, text=reply.content if reply is not None and calls else None, tool_calls=calls,
                               latency=timings or None, error="the generation failed" if status == "failed" else None,
                               message_metadata=self.memory.metadata() if self.memory is not None else None, **tokens)
        question = next((m.content for m in reversed(self.plan.messages) if m.role == "user"), None)
        attached = self.attached
        if (attached is not None and status == "completed" and attached.conversation.title is None
                and not attached.history and question and self.generator is not None):
            title_later(attached.store, self.generator, attached.conversation.owner, attached.conversation.id, question)
        left = status != "failed" and self.read_now is not None and not self.read_now()
        log_event("chat.completion", request_id=self.request_id, completion_id=self.completion_id, model=self.model,
                  stream=self.stream, status="client_left" if left else status, finish_reason=finish_reason,
                  conversation_id=self.attached.conversation.id if self.attached else None, message_id=self.writer.reply.id if self.writer else None,
                  **tokens, **timings, content={"last_user_message": question, "output_text": text})


def _json_reply(chat: ChatCompletionRequest, path: ReplyPath) -> bool:
    """What the client reads is constrained to JSON (a forced memory call is not the client's to read)."""
    json_format = chat.response_format is not None and chat.response_format.type != "text"
    return json_format or path.client_reads_constraint


def _finish_reason(result: GenerationResult, guard: OutputGuard) -> str:
    if guard.blocked is not None:
        return "content_filter"
    return "length" if result.finish_reason == "length" else "stop"


def _ms(start: float, end: float | None) -> float | None:
    return None if end is None else round((end - start) * 1000, 1)


async def _sse(
    stream: Reply, plan: ChatPlan, cid: str, model: str, fingerprint: str, include_usage: bool,
    record: CompletionRecord, guard: OutputGuard, remembered: Recall | None,
) -> AsyncIterator[bytes]:
    created = int(time.time())

    def chunk(**fields: Any) -> bytes:
        return sse_data(chunk_object(cid, model, created, fingerprint, **fields))

    # With tools, text that may begin a call block is held back until it is known (tool_calls.py).
    splitter = ReplySplitter() if plan.tools else None
    parsed: ParsedReply | None = None
    logged = False
    record.start()
    try:
        yield chunk(delta={"role": "assistant", "content": ""})
        async for safe in guarded(stream, guard):  # the classifier's first tokens never wait for it
            record.delta(safe)
            if text := splitter.feed(safe) if splitter is not None else safe:
                yield chunk(delta={"content": text})
        result = await stream.result()
        finish = _finish_reason(result, guard)
        if splitter is not None and guard.blocked is None:
            reply = parsed = parse_reply(splitter.held, plan.tools)
            if reply.calls:
                finish = "tool_calls"
                if reply.content:  # text the model wrote after its calls
                    yield chunk(delta={"content": reply.content})
                for index, call in enumerate(reply.calls):
                    yield chunk(delta={"tool_calls": [call.openai(index)]})
            elif splitter.held:
                yield chunk(delta={"content": splitter.held})
        if guard.blocked is not None:
            yield chunk(delta={"refusal": refusal(guard.blocked)})
        last = chunk_object(cid, model, created, fingerprint, delta={}, finish_reason=finish)
        if remembered is not None:  # not in the chunk's type: an extra field, as the completion's metadata
            last["metadata"] = remembered.metadata()  # on the last chunk: the reply may have saved one
        yield sse_data(last)
        record.done("completed", result, finish, guard.text, reply=parsed)
        logged = True
        if include_usage:
            yield chunk(usage=usage_object(result.prompt_tokens, result.completion_tokens, result.cached_prompt_tokens))
        await record.stored()
        yield DONE
    except ApiError as exc:  # headers are gone: the error travels in the stream, as OpenAI does
        log.warning("chat stream %s failed: %s", cid, exc)  # the backend, or a memory round's prompt did not fit
        record.done("failed")
        logged = True
        yield sse_data({"error": exc.body()})
    except Exception as exc:
        log.exception("chat stream %s failed", cid)
        record.done("failed")
        logged = True
        yield sse_data({"error": {"message": str(exc), "type": "server_error", "param": None, "code": "internal_error"}})
    finally:
        # Runs when the client disconnects too (the generator is closed): free the engine slot.
        await stream.close()
        await guard.close()
        if not logged:
            record.done("cancelled")
