"""The built-in `remember` tool (memory.py) inside one reply: the model's calls to it run here, out of the
client's sight, and the reply goes on in a second round that reads their results.

A transport reads a MemoryToolStream as it reads the engine's stream: text deltas, then `result()`. Text that may
begin a call block is held (tool_calls.ReplySplitter) until the block is known. A block of `remember` calls only is
run and followed by the second round's text (or by text the model wrote after it, which then ends the reply). A
block that also calls the client's functions passes on with those only, for the transport to parse; its
`remember` calls run all the same. The second round may generate what the first left of `max_tokens`.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import replace
from typing import Protocol

from gateway.generation.memory import REMEMBER_TOOL, Recall
from gateway.safety.policy import SafetyPolicy
from inference.llm.backend import GenerationResult, GenerationStream
from inference.llm.chat import ChatMessage
from inference.llm.tool_calls import ReplySplitter, ToolFormat, ToolSpec, parse_reply, write_calls


class Generation(Protocol):
    """What a reply is read from: the engine's stream, or an adopted preemption's (preemption.AdoptedStream)."""

    def __aiter__(self) -> AsyncIterator[str]: ...

    async def result(self) -> GenerationResult: ...

    def cancel(self) -> None: ...

    def pace(self, not_needed_before: float) -> None: ...


# The second round: the messages to add to the first round's (its calls and their results), and its max_tokens.
FollowUp = Callable[[list[ChatMessage], int], Awaitable[GenerationStream]]


class MemoryToolStream:
    def __init__(self, first: Generation, recall: Recall, policy: SafetyPolicy, follow_up: FollowUp, *,
                 client_tools: list[ToolSpec], tool_format: ToolFormat, max_tokens: int) -> None:
        self._rounds: list[Generation] = [first]
        self._recall = recall
        self._policy = policy
        self._follow_up = follow_up
        self._client_tools = client_tools
        self._format = tool_format
        self._max_tokens = max_tokens
        self._first_text_at: float | None = None  # what the client saw first (time.monotonic, as the results)
        self.cancelled = False

    def __aiter__(self) -> AsyncIterator[str]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[str]:
        splitter = ReplySplitter()
        async for delta in self._rounds[0]:
            if text := splitter.feed(delta):
                yield self._seen(text)
        held = splitter.held
        parsed = parse_reply(held, [REMEMBER_TOOL, *self._client_tools]) if held else None
        saves = [call for call in parsed.calls if call.name == REMEMBER_TOOL.name] if parsed is not None else []
        if parsed is None or not saves:
            if held:
                yield self._seen(held)
            return
        messages = await self._recall.save_calls(saves, self._policy)
        others = [call for call in parsed.calls if call.name != REMEMBER_TOOL.name]
        if others:
            yield self._seen(write_calls(parsed.content, tuple(call.openai() for call in others), self._format))
            return
        if parsed.content:  # the model already answered after its call
            yield self._seen(parsed.content)
            return
        first = await self._rounds[0].result()
        left = self._max_tokens - first.completion_tokens
        if self.cancelled or first.finish_reason != "stop" or left <= 0:
            return
        follow = await self._follow_up(messages, left)
        self._rounds.append(follow)
        if self.cancelled:  # cancelled while the second round was being prepared
            follow.cancel()
        async for delta in follow:
            yield self._seen(delta)

    def _seen(self, text: str) -> str:
        if self._first_text_at is None:
            self._first_text_at = time.monotonic()
        return text

    async def result(self) -> GenerationResult:
        """The rounds as one generation: their tokens summed, the last one's end, and the first token the client
        saw (the second round's, when the first only called `remember`)."""
        results = [await stream.result() for stream in self._rounds]
        first, last = results[0], results[-1]
        return replace(
            last,
            text="".join(result.text for result in results),
            token_ids=[token for result in results for token in result.token_ids],
            prompt_tokens=sum(result.prompt_tokens for result in results),
            completion_tokens=sum(result.completion_tokens for result in results),
            cached_prompt_tokens=sum(result.cached_prompt_tokens for result in results),
            submitted_at=first.submitted_at,
            admitted_at=first.admitted_at,
            first_token_at=self._first_text_at if self._first_text_at is not None else first.first_token_at,
            first_step_probability=first.first_step_probability,
        )

    def cancel(self) -> None:
        self.cancelled = True
        self._rounds[-1].cancel()

    def pace(self, not_needed_before: float) -> None:
        self._rounds[-1].pace(not_needed_before)


ReplyStream = Generation | MemoryToolStream  # what the transports read a reply from
