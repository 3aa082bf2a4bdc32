"""The memory tool's rounds inside one reply (memory_tool.py), over real GenerationStreams fed by hand: what the
client reads, what is saved, and when a second round runs."""

from __future__ import annotations

import asyncio
import json

from gateway.generation.memory import Recall
from gateway.generation.memory_tool import MemoryToolStream
from gateway.platform.storage.schema import MemoryRow
from gateway.safety.detectors import denylist_detector
from gateway.safety.policy import Rule, SafetyPolicy
from inference.llm.backend import GenerationResult, GenerationStream
from inference.llm.chat import ChatMessage
from inference.llm.tool_calls import ToolSpec

REMEMBER = '<tool_call>[{"name": "remember", "arguments": {"fact": "my dog is Rex"}}]</tool_call>'
WEATHER = ToolSpec("weather", None, {"type": "object", "properties": {"city": {"type": "string"}}})


class ListStore:
    """A MemoryStore's `add`, kept in a list (the state machine under test does not read them back)."""

    def __init__(self) -> None:
        self.rows: list[MemoryRow] = []

    async def add(self, owner: str, content: str) -> MemoryRow:
        row = MemoryRow(id=f"mem_{len(self.rows)}", owner=owner, content=content, created_at=0.0)
        self.rows.append(row)
        return row


def finished(text: str, tokens: int, prompt: int = 10, at: float = 1.0) -> GenerationStream:
    stream = GenerationStream("r", asyncio.get_running_loop())
    for piece in [text[i:i + 7] for i in range(0, len(text), 7)]:
        stream.deliver(piece, None, None)
    stream.deliver(None, GenerationResult(text, [1] * tokens, "stop", prompt, tokens, 2, at, at + 0.1, at + 1), None)
    return stream


class Rounds:
    def __init__(self, second: str | None = None, policy: SafetyPolicy | None = None) -> None:
        self.store = ListStore()
        self.recall = Recall(store=self.store, owner="key_1")  # type: ignore[arg-type]
        self.second = second
        self.asked: list[tuple[list[ChatMessage], int]] = []
        self.policy = policy or SafetyPolicy([])

    async def follow_up(self, added: list[ChatMessage], left: int) -> GenerationStream:
        self.asked.append((added, left))
        assert self.second is not None
        return finished(self.second, 3, prompt=40, at=5.0)

    def stream(self, first: GenerationStream, tools: list[ToolSpec] | None = None) -> MemoryToolStream:
        return MemoryToolStream(first, self.recall, self.policy, self.follow_up, client_tools=tools or [],
                                tool_format="list", max_tokens=32)


async def read(stream: MemoryToolStream) -> str:
    return "".join([delta async for delta in stream])


async def test_text_passes_through_untouched() -> None:
    rounds = Rounds()
    stream = rounds.stream(finished("Paris is the capital. <tool", 6))
    assert await read(stream) == "Paris is the capital. <tool"
    result = await stream.result()
    assert (result.completion_tokens, result.prompt_tokens) == (6, 10) and not rounds.asked and not rounds.store.rows


async def test_a_remember_call_is_run_and_the_reply_goes_on() -> None:
    rounds = Rounds(second="Got it!")
    stream = rounds.stream(finished(REMEMBER, 20))
    assert await read(stream) == "Got it!"  # the call is not the client's to see
    assert [row.content for row in rounds.store.rows] == ["my dog is Rex"] and rounds.recall.saved == rounds.store.rows
    (added, left), = rounds.asked
    assert left == 32 - 20
    assert added[0].role == "assistant" and json.loads(added[0].tool_calls[0]["function"]["arguments"]) == \
        {"fact": "my dog is Rex"}
    assert added[1] == ChatMessage("tool", "Saved.", tool_call_id=added[0].tool_calls[0]["id"])
    result = await stream.result()
    assert (result.prompt_tokens, result.completion_tokens, result.cached_prompt_tokens) == (50, 23, 4)
    assert result.submitted_at == 1.0 and result.finished_at == 6.0
    assert result.first_token_at is not None and result.first_token_at > 5.0  # the first text the client saw


async def test_client_calls_in_the_same_block_pass_on_without_the_remember_call() -> None:
    rounds = Rounds()
    block = ('<tool_call>[{"name": "remember", "arguments": {"fact": "likes rain"}}, '
             '{"name": "weather", "arguments": {"city": "Oslo"}}]</tool_call>')
    out = await read(rounds.stream(finished(block, 30), [WEATHER]))
    assert out == '<tool_call>[{"name": "weather", "arguments": {"city": "Oslo"}}]</tool_call>'
    assert [row.content for row in rounds.store.rows] == ["likes rain"] and not rounds.asked


async def test_text_after_the_call_ends_the_reply() -> None:
    rounds = Rounds()
    assert await read(rounds.stream(finished(REMEMBER + " I will remember.", 25))) == "I will remember."
    assert len(rounds.store.rows) == 1 and not rounds.asked


async def test_a_fact_the_policy_refuses_is_not_saved() -> None:
    detector = denylist_detector(["Rex"])
    assert detector is not None
    rounds = Rounds(second="Sorry.", policy=SafetyPolicy([Rule(detector, "block")]))
    assert await read(rounds.stream(finished(REMEMBER, 20))) == "Sorry."
    assert not rounds.store.rows and rounds.asked[0][0][1].content == "Not saved: the content policy refused it."


async def test_a_cancel_before_the_second_round_starts_none() -> None:
    rounds = Rounds(second="never")
    stream = rounds.stream(finished(REMEMBER, 20))
    stream.cancel()
    assert await read(stream) == "" and not rounds.asked
    assert len(rounds.store.rows) == 1  # the call was made: its fact is kept


async def test_no_second_round_when_the_first_used_every_token() -> None:
    rounds = Rounds(second="never")
    assert await read(rounds.stream(finished(REMEMBER, 32))) == "" and not rounds.asked
