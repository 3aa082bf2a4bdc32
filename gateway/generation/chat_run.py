"""One chat completion, from its request to its stored end, on the one generation path (as response_run.py is
one response of the Responses API).

- `ChatRun.prepare` builds the prompt: the request's messages (screened by the safety policy), after the stored
  conversation's branch when the request names one; their tools, tool_choice and response_format become a
  ReplyForm, and the reply takes the one reply path (reply_path.py: memory, plan, render, reserve, start). Every
  refusal happens here, before anything streams.
- `chunks()` runs it streamed: the reply through the output guard, its text and its calls (tool_calls.py) as
  `chat.completion.chunk` objects, an error object last when it fails.
- `complete()` runs it whole: the `chat.completion` object.

Either way the completion is counted, logged once (CompletionRecord) and, when attached to a conversation, stored.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass
from typing import Any

from gateway.generation.chat_history import AttachedChat
from gateway.generation.chat_plan import ChatPlan, ReplyForm
from gateway.generation.memory import Recall
from gateway.generation.reply_path import PromptFields, ReplyPath, ReplyRequest, RunDeps
from gateway.generation.service import Generator, Reply
from gateway.generation.titles import title_later
from gateway.platform import metrics
from gateway.platform.event_log import log_event
from gateway.platform.storage.conversations import MessageStatus
from gateway.platform.storage.writer import MessageWriter
from gateway.protocol.chat import ChatCompletionRequest, chunk_object, completion_id, completion_object, usage_object
from gateway.protocol.errors import ApiError
from gateway.safety.output import CLASSIFIER, OutputGuard, guarded, refusal
from gateway.safety.screening import screen_messages
from inference.llm.backend import GenerationResult
from inference.llm.chat import ChatMessage
from inference.llm.tool_calls import ParsedReply, ReplySplitter, parse_reply

log = logging.getLogger(__name__)


class ChatRun:
    def __init__(self, chat: ChatCompletionRequest, path: ReplyPath, reply: Reply, record: CompletionRecord,
                 guard: OutputGuard, fingerprint: str) -> None:
        self.chat = chat
        self.id = record.completion_id
        self.record = record
        self.reservation_headers = path.reservation.headers() if path.reservation is not None else {}
        # One attached to a conversation is stored whole: its stream runs to its end without its client.
        self.runs_to_end = record.attached is not None
        self.failed = False  # a stream's: it ended with an error object, not its last chunk
        self._path = path
        self._reply = reply
        self._guard = guard
        self._fingerprint = fingerprint

    @classmethod
    async def prepare(cls, deps: RunDeps, chat: ChatCompletionRequest, owner: str,
                      request_id: str | None) -> ChatRun:
        """Build, render and reserve the completion's prompt and start its generation. Raises ApiError (a
        refusal, a missing conversation, the quota, the context)."""
        generator = deps.generator
        max_tokens = chat.wanted_max_tokens() or deps.default_max_tokens
        # The policy on the request's user and tool messages (a stored history was screened when it came).
        request_messages = screen_messages(generator.safety, [message.to_chat() for message in chat.messages])
        attached = await AttachedChat.load(deps.conversations, owner, chat.conversation) if chat.conversation else None
        base = attached.prompt_messages(request_messages) if attached is not None else list(request_messages)
        sampling = chat.sampling(max_tokens, deps.repetition_penalty)
        reply_request = ReplyRequest(base, ReplyForm.of_chat(chat), sampling,
                                     PromptFields(context="messages", schema="response_format"),
                                     question=request_messages)
        # 429 past --rate-limit-tpm
        path = await ReplyPath.prepare(generator, reply_request, memory=deps.memory, tokens=deps.tokens)
        reply = await path.start(routing_key=chat.conversation)
        record = CompletionRecord(request_id, completion_id(), chat.model, chat.stream, path.plan, attached,
                                  request_messages, generator=generator, memory=path.remembered)
        # The rules on the reply as it streams, and the classifier beside it (on the question at once).
        guard = generator.guard(reply.cancel, json_output=_json_reply(chat, path))
        guard.start(next((m.content for m in reversed(request_messages) if m.role == "user"), ""))
        return cls(chat, path, reply, record, guard, f"fp_{deps.model_name}")

    async def complete(self) -> dict[str, Any]:
        """The whole completion (`chat.completion`), once the reply has ended."""
        chat, plan, guard, stream, record = self.chat, self._path.plan, self._guard, self._reply, self.record
        remembered = self._path.remembered  # None unless the key opted in
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
        body = completion_object(self.id, chat.model, content, finish, usage, self._fingerprint, tool_calls=calls,
                                 refusal=refused)
        if remembered is not None:
            body["metadata"] = remembered.metadata()
        record.delta(text)
        record.done("completed", result, finish, text, reply=reply)
        await record.stored()
        return body

    async def chunks(self) -> AsyncGenerator[dict[str, Any], None]:
        """The streamed completion: its chunks, the usage chunk last when asked for; an error object instead of
        the rest when it fails (`failed`). Closing the iterator early cancels it."""
        chat, plan, guard, stream, record = self.chat, self._path.plan, self._guard, self._reply, self.record
        remembered = self._path.remembered
        include_usage = bool(chat.stream_options and chat.stream_options.include_usage)
        created = int(time.time())

        def chunk(**fields: Any) -> dict[str, Any]:
            return chunk_object(self.id, chat.model, created, self._fingerprint, **fields)

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
            last = chunk(delta={}, finish_reason=finish)
            if remembered is not None:  # not in the chunk's type: an extra field, as the completion's metadata
                last["metadata"] = remembered.metadata()  # on the last chunk: the reply may have saved one
            yield last
            record.done("completed", result, finish, guard.text, reply=parsed)
            logged = True
            if include_usage:
                yield chunk(usage=usage_object(result.prompt_tokens, result.completion_tokens,
                                               result.cached_prompt_tokens))
            await record.stored()
        except ApiError as exc:  # headers are gone: the error travels in the stream, as OpenAI does
            log.warning("chat stream %s failed: %s", self.id, exc)  # the backend, or a memory round's prompt did not fit
            record.done("failed")
            logged = self.failed = True
            yield {"error": exc.body()}
        except Exception:  # a defect of ours: the log has it, the client our words (never the exception's)
            log.exception("chat stream %s failed", self.id)
            record.done("failed")
            logged = self.failed = True
            yield {"error": {"message": "The server failed to generate the reply.", "type": "server_error",
                             "param": None, "code": "internal_error"}}
        finally:
            # Runs when the client disconnects too (the iterator is closed): free the engine slot.
            await stream.close()
            await guard.close()
            if not logged:
                record.done("cancelled")


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
