"""One message of the seeds' streaming conversation API (/backend-api/conversation/{id}/messages), from its
request to its stored reply, on the one generation path; and the pre-warm of a draft being typed.

- `ConversationRun.start` resolves where the message goes (under `parent_message_id`, by default the current
  leaf; null: a new root), builds the prompt (the branch up to the parent, then the message; without a message,
  a new reply to the parent user message), and takes the one reply path (reply_path.py: memory, plan, render,
  reserve, start). Every refusal happens here, before anything streams.
- `events()` runs it: the reply through the output guard, as the stream's `delta_encoding: v1` payloads (JSON
  pointer patches), stored as it streams; then the title of a new conversation. The transport encodes them as
  SSE; the run goes on to its end even if the client leaves.
- `prepare_draft` prefills the conversation and the draft at background priority (prewarm.py).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from gateway.generation.chat_history import chat_message
from gateway.generation.chat_plan import ReplyForm
from gateway.generation.memory import Recall
from gateway.generation.prewarm import Prewarmer
from gateway.generation.reply_path import PromptFields, ReplyPath, ReplyRequest, RunDeps
from gateway.generation.service import Reply
from gateway.generation.titles import generate_title
from gateway.platform.storage.conversations import MessageStatus, NewMessage
from gateway.platform.storage.schema import ConversationRow
from gateway.platform.storage.writer import MessageWriter
from gateway.protocol.chat import completion_id
from gateway.protocol.errors import ApiError
from gateway.safety.output import OutputGuard, guarded
from inference.llm.backend import SamplingParams
from inference.llm.chat import ChatMessage

log = logging.getLogger(__name__)
TEXT_PATH = "/message/content/parts/0"
DEFAULT_TEMPERATURE = 0.7
# One of the stream's payloads and its SSE event name (None: a data-only event).
Payload = tuple[Any, str | None]


@dataclass
class ConversationTurn:
    conversation: ConversationRow
    parent_id: str | None  # where the new message (or the regenerated reply) goes
    messages: list[ChatMessage]  # the prompt: the branch up to the parent, then the new message
    new_user: NewMessage | None  # stored with the reply; None when regenerating


async def resolve_turn(deps: RunDeps, owner: str, conversation_id: str, content: str | None, parent_given: bool,
                       parent_message_id: str | None) -> ConversationTurn:
    """Where the message goes and what its prompt is; 404 for a parent not in the conversation, 400 for a
    regenerated reply whose parent is not a user message."""
    store = deps.conversations
    conversation = await store.get(owner, conversation_id)
    parent = parent_message_id if parent_given else conversation.current_leaf_id
    rows = await store.branch(conversation, parent) if parent is not None else []
    if parent is not None and (not rows or rows[-1].id != parent):
        raise ApiError("message_not_found", f"No message '{parent}' in this conversation.", "parent_message_id",
                       status=404)
    history = [chat_message(row) for row in rows]
    if content is None:
        if not rows or rows[-1].role != "user":
            raise ApiError("invalid_value", "Without content the reply is regenerated, so parent_message_id must be "
                           "a user message.", "parent_message_id")
        return ConversationTurn(conversation, parent, history, None)
    user = NewMessage(role="user", content=[{"type": "text", "text": content}])
    return ConversationTurn(conversation, parent, [*history, ChatMessage("user", content)], user)


def _reply_request(deps: RunDeps, turn: ConversationTurn, max_tokens: int, *, save: bool,
                   temperature: float | None = None) -> ReplyRequest:
    """A turn's reply: no tools of the client's (with the key's memory on, the model may save memories).
    `save`: the turn's question is saved when it asks to be remembered (not a draft's, not a regenerated one's)."""
    sampling = SamplingParams(temperature=DEFAULT_TEMPERATURE if temperature is None else temperature,
                              repetition_penalty=deps.repetition_penalty, max_tokens=max_tokens)
    return ReplyRequest(turn.messages, ReplyForm([]), sampling, PromptFields(context="content"), save_memory=save)


async def prepare_draft(deps: RunDeps, prewarmer: Prewarmer, owner: str, conversation_id: str, draft: str,
                        parent_given: bool, parent_message_id: str | None) -> int:
    """The user is typing `draft` (screened): its prompt as the message's will be goes into the prefix cache, with
    no tokens reserved (nothing is generated). Returns its length in tokens."""
    turn = await resolve_turn(deps, owner, conversation_id, draft, parent_given, parent_message_id)
    path = await ReplyPath.prepare(deps.generator, _reply_request(deps, turn, deps.default_max_tokens, save=False),
                                   memory=deps.memory)
    prewarmer.prepare(deps.generator.engine, owner, conversation_id, path.prompt_ids)
    return len(path.prompt_ids)


class ConversationRun:
    def __init__(self, deps: RunDeps, prewarmer: Prewarmer, owner: str, turn: ConversationTurn, reply: Reply,
                 guard: OutputGuard, writer: MessageWriter, prepared_tokens: int, title_for: str | None,
                 remembered: Recall | None) -> None:
        self.deps = deps
        self._prewarmer = prewarmer
        self.owner = owner
        self.turn = turn
        self._reply = reply
        self._guard = guard
        self._writer = writer
        self._prepared_tokens = prepared_tokens  # the draft's tokens pre-warmed for this prompt (0: none)
        self._title_for = title_for  # a new conversation's first question, which names it
        self._remembered = remembered
        self.stream_id = completion_id().replace("chatcmpl-", "strm_")  # the stream's resume token
        self.completed = False  # its events ran to their end (not to an error)
        self.reservation_headers = reply.reservation.headers() if reply.reservation is not None else {}

    @classmethod
    async def start(cls, deps: RunDeps, prewarmer: Prewarmer, owner: str, conversation_id: str, *,
                    content: str | None, parent_given: bool, parent_message_id: str | None, max_tokens: int | None,
                    temperature: float | None, model: str) -> ConversationRun:
        """Resolve, build and reserve the message's reply and start its generation. `content`: the screened
        message (None: regenerate the parent's reply). Raises ApiError (a missing conversation or parent, the
        quota, the context)."""
        turn = await resolve_turn(deps, owner, conversation_id, content, parent_given, parent_message_id)
        request = _reply_request(deps, turn, max_tokens or deps.default_max_tokens, save=content is not None,
                                 temperature=temperature)
        # 429 past --rate-limit-tpm
        path = await ReplyPath.prepare(deps.generator, request, memory=deps.memory, tokens=deps.tokens)
        prepared = prewarmer.prepared_tokens(owner, conversation_id, path.prompt_ids)
        reply = await path.start(routing_key=conversation_id)
        # The rules on the reply as it streams, and the classifier beside it.
        guard = deps.generator.guard(reply.cancel)
        stored = NewMessage(role="assistant", content=[], status="in_progress", model=model)
        writer = MessageWriter(deps.conversations, turn.conversation.id, turn.parent_id,
                               [turn.new_user] if turn.new_user is not None else [], stored)
        title_for = content if turn.conversation.title is None and turn.new_user is not None else None
        return cls(deps, prewarmer, owner, turn, reply, guard, writer, prepared, title_for, path.remembered)

    async def events(self) -> AsyncIterator[Payload]:
        """Runs the reply: the stream's payloads, the title last. A failure after the first payload travels in the
        stream (an error payload, the message left incomplete)."""
        turn, writer, reply, guard = self.turn, self._writer, self._reply, self._guard
        conversation_id = turn.conversation.id
        guard.start(next((m.content for m in reversed(turn.messages) if m.role == "user"), ""))  # classified at once
        try:
            yield "v1", "delta_encoding"
            yield {"type": "resume_conversation_token", "token": self.stream_id, "conversation_id": conversation_id}, None
            input_id = turn.new_user.id if turn.new_user is not None else None
            message = {"id": writer.reply.id, "author": {"role": "assistant"},
                       "content": {"content_type": "text", "parts": [""]}, "status": "in_progress",
                       "metadata": {"parent_id": input_id or turn.parent_id, "model": writer.reply.model}}
            yield {"p": "", "o": "add", "v": {"message": message, "conversation_id": conversation_id,
                                              "input_message_id": input_id}}, "delta"
            first = True
            async for safe in guarded(reply, guard):
                writer.append(safe)
                yield ({"p": TEXT_PATH, "o": "append", "v": safe} if first else {"v": safe}), "delta"
                first = False
            result = await reply.result()
            finish_reason = "content_filter" if guard.blocked is not None else result.finish_reason
            status: MessageStatus = "incomplete" if finish_reason in ("length", "content_filter") else "completed"
            usage: dict[str, Any] = {"input_tokens": result.prompt_tokens, "cached_tokens": result.cached_prompt_tokens,
                                     "output_tokens": result.completion_tokens}
            latency = {"ttft_ms": None if result.first_token_at is None else
                       round((result.first_token_at - result.submitted_at) * 1000, 1)}
            memories = self._remembered.metadata() if self._remembered is not None else None
            writer.finish(status, latency=latency, message_metadata=memories, **usage)
            metadata = {"finish_reason": finish_reason, "usage": usage, **latency, **(memories or {}),
                        "prewarmed": self._prepared_tokens > 0 and result.cached_prompt_tokens >= self._prepared_tokens}
            yield {"p": "", "o": "patch", "v": [{"p": "/message/status", "o": "replace", "v": status},
                                                {"p": "/message/metadata", "o": "append", "v": metadata}]}, "delta"
            await writer.written()
            if self._title_for is not None and (title := await self._title(self._title_for)):
                yield {"type": "title_generation", "title": title, "conversation_id": conversation_id}, None
            self.completed = True
        except asyncio.CancelledError:  # the server is shutting down
            writer.finish("cancelled")
            raise
        except Exception:  # headers are gone: the error travels in the stream, in our words (never the exception's)
            log.exception("conversation stream %s failed", self.stream_id)
            writer.finish("incomplete", error="the generation failed")
            yield {"type": "error", "error": {"message": "The server failed to generate the reply.",
                                              "type": "server_error", "code": "internal_error"}}, None
            yield {"p": "", "o": "patch", "v": [{"p": "/message/status", "o": "replace", "v": "incomplete"}]}, "delta"
        finally:
            await reply.close()  # settles the tokens
            await guard.close()
            # Only now: the reply's KV extends the prepared prefix, which an earlier unpin would have dropped.
            self._prewarmer.release(self.deps.generator.engine, self.owner, conversation_id)

    async def _title(self, question: str) -> str | None:
        conversation_id = self.turn.conversation.id
        title = await generate_title(self.deps.generator, question, conversation_id)
        if title is not None:
            await self.deps.conversations.update(self.owner, conversation_id, title=title)
        return title
