"""One response of the Responses API, from its request to its stored end, on the one generation path.

- `ResponseRun.prepare` builds the prompt: the instructions, then what comes before the input (the chain of
  `previous_response_id`, its inputs and outputs; or the stored conversation's current branch), then the input
  (screened by the safety policy). The tools, tool_choice and text.format become a ReplyForm, as a chat
  completion's, and the reply takes the one reply path (reply_path.py: memory, plan, render, reserve, start).
  Every refusal happens here, before anything streams.
- `events()` runs it: the reply through the output guard, its text and its calls (tool_calls.py) as the
  stream's events (protocol/response_objects.py), then the terminal event. The response is stored as it starts
  and as it ends (unless `store` is false); with `conversation`, its input and output items are appended to the
  conversation when it ends.
- `cancel()` stops it: the run ends `cancelled`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

from openai import BaseModel

from gateway.generation.chat_history import chat_message
from gateway.generation.chat_plan import ReplyForm
from gateway.generation.reply_path import PromptFields, ReplyPath, ReplyRequest, RunDeps
from gateway.generation.response_prompt import conversation_message, item_message, items_messages, merge_turns
from gateway.generation.service import Reply
from gateway.platform.event_log import log_event
from gateway.platform.storage.conversations import MessageStatus
from gateway.platform.storage.schema import ConversationRow
from gateway.protocol.errors import ApiError
from gateway.protocol.response_objects import ResponsesApiEvents, ResponseState, Usage, input_items, wire
from gateway.protocol.responses import FunctionChoice, JsonObjectFormat, JsonSchemaFormat, ResponseCreateRequest
from gateway.safety.output import CLASSIFIER, guarded, refusal
from gateway.safety.screening import screen_messages
from inference.llm.backend import SamplingParams
from inference.llm.chat import ChatMessage
from inference.llm.tool_calls import ReplySplitter, ToolSpec, parse_reply

log = logging.getLogger(__name__)


def reply_form(request: ResponseCreateRequest) -> ReplyForm:
    choice = request.tool_choice
    text_format = request.text_format
    return ReplyForm([ToolSpec(tool.name, tool.description, tool.parameters) for tool in request.tools or []],
                     "function" if isinstance(choice, FunctionChoice) else choice,
                     choice.name if isinstance(choice, FunctionChoice) else None,
                     request.parallel_tool_calls is not False,
                     text_format.schema_ if isinstance(text_format, JsonSchemaFormat) else None,
                     isinstance(text_format, JsonObjectFormat))


class ResponseRun:
    def __init__(self, deps: RunDeps, request: ResponseCreateRequest, owner: str, state: ResponseState,
                 items: list[dict[str, Any]], path: ReplyPath, reply: Reply, question: str,
                 conversation: ConversationRow | None) -> None:
        self.deps = deps
        self.request = request
        self.owner = owner
        self.state = state
        self.input_items = items
        self._reply = reply
        self._path = path
        self._question = question
        self._conversation = conversation
        self.failure: ApiError | None = None  # what failed it, when it failed
        self.reservation_headers = reply.reservation.headers() if reply.reservation is not None else {}
        self.ended = asyncio.Event()
        self._cancelled = False

    @classmethod
    async def prepare(cls, deps: RunDeps, request: ResponseCreateRequest, owner: str) -> ResponseRun:
        """Build, render and reserve the response's prompt, store it as in progress and start its generation.
        Raises ApiError (a refusal, a missing previous response or conversation, the quota, the context)."""
        items = input_items(request)
        # Each item's message, screened with the item's index for a refusal to name, then made turns.
        screened = screen_messages(deps.generator.safety, [item_message(item) for item in items], param="input")
        history: list[ChatMessage] = []
        conversation: ConversationRow | None = None
        state = ResponseState(request, request.max_output_tokens or deps.default_max_tokens, dict(request.metadata or {}))
        chain_root = state.id
        if request.previous_response_id is not None:
            chain = await deps.responses.chain(owner, request.previous_response_id)
            chain_root = chain[0].id
            for row in chain:
                history += items_messages(row.input_items) + items_messages(row.body.get("output") or [])
        elif request.conversation_id is not None:
            conversation = await deps.conversations.get(owner, request.conversation_id)
            history = [chat_message(row) for row in await deps.conversations.branch(conversation)]
        instructions = [ChatMessage("system", request.instructions)] if request.instructions else []
        base = merge_turns([*instructions, *history, *screened])
        if all(message.role in ("system", "developer") for message in base):
            raise ApiError("invalid_value", "There is nothing to answer: 'input' holds instructions only, and nothing "
                           "comes before it.", "input")
        sampling = SamplingParams(temperature=1.0 if request.temperature is None else request.temperature,
                                  top_p=request.top_p or 1.0, repetition_penalty=deps.repetition_penalty,
                                  max_tokens=state.max_output_tokens)
        truncated = ApiError("context_length_exceeded", "The input is longer than the model's context window; with "
                             "truncation 'auto' the oldest items are dropped until it fits.", "input")
        reply_request = ReplyRequest(base, reply_form(request), sampling,
                                     PromptFields(context="input", schema="text.format.schema"), question=screened,
                                     truncated=truncated if request.truncation != "auto" else None)
        # 429 past --rate-limit-tpm
        path = await ReplyPath.prepare(deps.generator, reply_request, memory=deps.memory, tokens=deps.tokens)
        # Routed by what continues across requests, so that its prefix stays cached where it was.
        reply = await path.start(routing_key=request.conversation_id or request.prompt_cache_key or chain_root)
        question = next((m.content for m in reversed(screened) if m.role == "user"), "")
        run = cls(deps, request, owner, state, items, path, reply, question, conversation)
        try:
            if request.store is not False:
                await deps.responses.create(owner, wire(state.object()), items)
        except BaseException:
            await reply.close()
            raise
        return run

    def cancel(self) -> None:
        self._cancelled = True
        self._reply.cancel()

    async def events(self) -> AsyncIterator[BaseModel]:
        """Runs the response: its events, the terminal one last. Closing the iterator early cancels it."""
        state, plan = self.state, self._path.plan
        events = ResponsesApiEvents(state)
        # What the client reads is constrained to JSON (a forced memory call is not the client's to read).
        json_output = self.request.text_format.type != "text" or self._path.client_reads_constraint
        guard = self.deps.generator.guard(self._reply.cancel, json_output=json_output)
        guard.start(self._question)
        splitter = ReplySplitter() if plan.tools else None
        finished = False
        try:
            for event in events.created():
                yield event
            async for safe in guarded(self._reply, guard):
                if text := splitter.feed(safe) if splitter is not None else safe:
                    for event in events.text(text):
                        yield event
            result = await self._reply.result()
            if splitter is not None and guard.blocked is None:
                parsed = parse_reply(splitter.held, plan.tools)
                if parsed.calls:
                    for event in events.text(parsed.content) if parsed.content else []:
                        yield event
                    for call in parsed.calls:
                        for event in events.call(call.id, call.name, call.arguments):
                            yield event
                elif splitter.held:
                    for event in events.text(splitter.held):
                        yield event
            if guard.blocked is not None:
                state.status, state.incomplete = "incomplete", "content_filter"
            elif result.finish_reason == "cancelled" or self._cancelled:
                state.status = "cancelled"
            elif result.finish_reason == "length":
                state.status, state.incomplete = "incomplete", "max_output_tokens"
            else:
                state.status = "completed"
            if guard.blocked is not None:
                for event in events.refusal(refusal(guard.blocked)):
                    yield event
            # A reply the classifier flagged is withheld whole when not streamed; JSON cut short is not JSON.
            keep_text = not (guard.blocked is CLASSIFIER and not self.request.stream) \
                and not (guard.blocked is not None and json_output)
            for event in events.close_message("completed" if state.status == "completed" else "incomplete",
                                              keep_text=keep_text):
                yield event
            state.usage = Usage(result.prompt_tokens, result.cached_prompt_tokens, result.completion_tokens)
            await self._finish()
            finished = True
            if state.status == "cancelled":
                for event in events.error("response_cancelled", "The response was cancelled "
                                          f"(POST /v1/responses/{state.id}/cancel)."):
                    yield event
            else:
                for event in events.finished():
                    yield event
        except ApiError as exc:  # the backend failed, or a memory round's prompt did not fit
            log.warning("response %s failed: %s", state.id, exc)
            self.failure = exc
            state.status = "failed"
            state.error = ("rate_limit_exceeded" if exc.status == 429 else "server_error", exc.message)
            if not finished:
                await self._finish()
                finished = True
            for event in events.finished():
                yield event
        except Exception:  # a bug: logged, and the client told in the stream, as chat does
            log.exception("response %s failed", state.id)
            self.failure = ApiError("internal_error", "The server failed to generate the response.",
                                    type="server_error", status=500)
            state.status, state.error = "failed", ("server_error", self.failure.message)
            if not finished:
                await self._finish()
                finished = True
            for event in events.error("internal_error", self.failure.message):
                yield event
        finally:
            await self._reply.close()  # frees the engine's slot if the client went away; settles the tokens
            await guard.close()
            if not finished:  # the client went away: the response is cancelled with it
                state.status = "cancelled"
                await asyncio.shield(self._finish())

    async def _finish(self) -> None:
        state = self.state
        if state.status == "completed":
            state.completed_at = int(time.time())
        if (remembered := self._path.remembered) is not None:
            state.metadata = {**state.metadata, **remembered.metadata()}
        try:
            if self.request.store is not False:
                await self.deps.responses.save(wire(state.object()))
            if self._conversation is not None and state.status != "failed":
                status: MessageStatus = "completed" if state.status == "completed" else "incomplete"
                messages = [*(conversation_message(item, "completed") for item in self.input_items),
                            *(conversation_message(wire(item), status) for item in state.output)]
                try:  # after whatever the conversation got while this ran (its leaf read as it is written)
                    await self.deps.conversations.append_to_leaf(self.owner, self._conversation.id, messages)
                except ApiError:  # the conversation was deleted meanwhile: there is nothing to add to
                    log.info("response %s: its conversation %s is gone", state.id, self._conversation.id)
        finally:
            self.ended.set()
            usage = state.usage
            log_event("responses.response", response_id=state.id, model=self.request.model, stream=self.request.stream,
                      status=state.status, conversation_id=self.request.conversation_id,
                      input_tokens=usage.input_tokens if usage else None,
                      cached_tokens=usage.cached_tokens if usage else None,
                      output_tokens=usage.output_tokens if usage else None)

