"""Running one Realtime response: prompt, token stream, text deltas, and speech clause by clause."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from gateway.generation.chat_plan import with_tools
from gateway.generation.memory import REMEMBER_TOOL, MemoryAccount, Recall, memory_off
from gateway.generation.service import Generator, MemoryRound, Prepared, PromptSpec, Reply
from gateway.platform import metrics
from gateway.platform.latency import TurnMarks
from gateway.platform.token_quota import TokenAccount
from gateway.protocol import server_events as se
from gateway.protocol.errors import ApiError
from gateway.realtime.conversation import SpokenSegment
from gateway.realtime.preemption import AdoptedStream, Preemption
from gateway.realtime.response_events import Event, ResponseEvents
from gateway.safety.hooks import Classifier
from gateway.safety.output import ContentFiltered
from gateway.safety.policy import SafetyPolicy
from inference.llm.backend import (
    GenerationResult,
    LLMBackend,
    SamplingParams,
)
from inference.llm.chat import ChatMessage
from inference.llm.tool_calls import ReplySplitter, ToolCall, ToolSpec, ToolUse, parse_reply
from inference.text import ClauseSplitter
from inference.tts import TtsEngine

log = logging.getLogger(__name__)


class SpeechStream(Protocol):
    """Where one response's audio goes: WebSocket deltas, or the WebRTC playout buffer."""

    def write(self, pcm: np.ndarray) -> None: ...

    def close(self) -> None: ...


@dataclass
class ResponseJob:
    messages: list[ChatMessage]
    sampling: SamplingParams
    conversation_key: str | None = None
    marks: TurnMarks = field(default_factory=TurnMarks)
    preemption: Preemption | None = None
    speech_speed: float = 1.0  # the session's audio.output.speed
    tool_use: ToolUse = field(default_factory=lambda: ToolUse([]))  # the client's tools the reply may call
    # The reply's tools with these built-in ones offered too (memory's `remember`): `tool_use` plus those.
    plan_tools: Callable[[list[ToolSpec]], ToolUse] = lambda builtin: ToolUse([])
    names_memory_tool: bool = False  # tool_choice names `remember`: refused unless the key's memory is on
    safety: SafetyPolicy = field(default_factory=lambda: SafetyPolicy([]))  # on the reply as it streams
    tokens: TokenAccount | None = None  # the key's tokens per minute (token_quota.py)
    classifier: Classifier | None = None  # beside the rules (safety/hooks.py)
    memory: MemoryAccount | None = None  # the key's memory (gateway/generation/memory.py)
    classifier_timeout_s: float = 2.0


def reply_spec(messages: list[ChatMessage], tool_use: ToolUse) -> PromptSpec:
    """A reply's prompt, and the grammar of its forced function call."""
    grammar = f"start: {tool_use.forced_block}" if tool_use.forced_block is not None else None
    return PromptSpec(messages, tool_use.template_tools, grammar,
                      grammar_message="A function's parameters cannot be used as a JSON schema")


class ResponseRunner:
    def __init__(
        self,
        *,
        engine: LLMBackend,
        tts: TtsEngine | None,
        job: ResponseJob,
        events: ResponseEvents,
        send: Callable[[list[Event]], None],
        speech: SpeechStream | None,
        open_message: Callable[[], None],
        add_calls: Callable[[list[ToolCall]], None],
        text_delta: Callable[[str], None],
    ) -> None:
        """`open_message`: puts the assistant message in the conversation (called before its first text, when
        the session did not open it upfront); `add_calls`: puts the reply's function calls there; `text_delta`:
        the reply's text as it is released (`send` takes the other events: the rate limits)."""
        self.generator = Generator(engine, job.safety, job.classifier, job.classifier_timeout_s)
        self.tts = tts
        self.job = job
        self.events = events
        self.send = send
        self.speech = speech
        self.open_message = open_message
        self.add_calls = add_calls
        self.text_delta = text_delta
        self.stream: Reply | None = None
        self._adopted: Preemption | None = None
        self._memory: Recall | None = None  # set when the model is offered the memory tool
        self._facts: list[ChatMessage] = []  # the memories that bear on the question
        # Text that may begin a match waits for the rest of it; the classifier runs beside the generation.
        self.guard = self.generator.guard(self.cancel_generation, marks=job.marks)

    async def run(self) -> GenerationResult:
        job = self.job
        try:
            remembered = await self._recall()
            if remembered is None and job.names_memory_tool:
                raise memory_off()
            offered = job.plan_tools([REMEMBER_TOOL]) if remembered is not None else job.tool_use
            if len(offered.tools) > len(job.tool_use.tools):  # the model may save memories itself
                self._memory = remembered
            if job.tool_use.forced_block is not None:  # the client's forced call: JSON, which labels must keep
                self.guard.expect_json()
            prepared = await self.generator.prepare(
                reply_spec([*with_tools(job.messages, offered), *self._facts], offered), job.sampling, job.tokens)
        except BaseException:
            self.cancel_generation()
            raise
        reservation = prepared.reservation
        if reservation is not None:  # as OpenAI: the tokens reserved for this response, given back at its end
            self.send([se.RateLimitsUpdated(rate_limits=[reservation.rate_limit()]).wire()])
        self.guard.start(next((m.content for m in reversed(job.messages) if m.role == "user"), ""))
        try:
            return await self._generate(prepared)
        finally:
            await self.guard.close()
            if self.stream is not None:  # settles the tokens (a submit that failed settled them itself)
                await self.stream.close()

    async def _recall(self) -> Recall | None:
        """With the key's memory on: the memories that bear on the question join the instructions, and the
        response's metadata lists them (and what the reply saved: see _generate)."""
        remembered = await self.job.memory.recall(self.job.messages) if self.job.memory is not None else None
        if remembered is None:
            return None
        self._facts = remembered.messages()  # the prompt's last: see Recall.messages
        self.events.metadata = {**(self.events.metadata or {}), **remembered.metadata()}
        return remembered

    def _after_save(self, added: list[ChatMessage]) -> PromptSpec:
        """The reply's second round, after the model saved memories: the client's tools only."""
        tools = self.job.tool_use
        return reply_spec([*with_tools([*self.job.messages, *added], tools), *self._facts], tools)

    async def _generate(self, prepared: Prepared) -> GenerationResult:
        job = self.job
        preemption, job.preemption = job.preemption, None
        adopted: AdoptedStream | None = None
        if (preemption is not None and prepared.rendered.constraint is None
                and preemption.prompt_ids == prepared.prompt_ids and preemption.sampling == job.sampling):
            self._adopted = preemption
            adopted = AdoptedStream(preemption)  # run_ahead reads the stream; its text is replayed
            job.marks.generation_started = preemption.started_at
            metrics.PREEMPTIONS.labels("adopted").inc()
        elif preemption is not None:
            log.debug("preempted reply dropped: the response's prompt or sampling differs")
            preemption.cancel()
        rounds = MemoryRound(self._memory, job.tool_use.tools, self._after_save) if self._memory is not None else None
        self.stream = deltas = await self.generator.start(prepared, conversation_id=job.conversation_key,
                                                          memory=rounds, adopted=adopted)
        if adopted is None:
            job.marks.mark("generation_started")
        tools = job.tool_use.tools
        # With tools, text that may begin a call block waits until it is known (tool_calls.py).
        reply = ReplySplitter() if tools else None
        clauses: asyncio.Queue[str | None] = asyncio.Queue()
        splitter = ClauseSplitter()

        def say(text: str) -> None:
            if not self.events.opened:
                self.open_message()
            self.text_delta(text)
            if self.speech is not None:
                for clause in splitter.push(text):
                    job.marks.mark("first_clause")
                    clauses.put_nowait(clause)

        guard = self.guard

        def release(safe: str) -> None:
            text = reply.feed(safe) if reply is not None else safe
            if text:
                say(text)
            if guard.blocked is not None:
                self.cancel_generation()  # stopped at once; the session ends the response (content_filter)
                guard.check()

        try:
            async with asyncio.TaskGroup() as group:
                if self.speech is not None:
                    group.create_task(self._speak(clauses))
                async for delta in deltas:
                    job.marks.mark("first_token")
                    release(guard.feed(delta))
                release(guard.flush())
                await guard.finish()  # the classifier's last verdicts
                release("")
                if reply is not None and reply.held:
                    parsed = parse_reply(reply.held, tools)
                    if parsed.calls:
                        self.add_calls(parsed.calls)
                    if parsed.content:
                        say(parsed.content)
                for clause in splitter.flush():
                    job.marks.mark("first_clause")
                    clauses.put_nowait(clause)
                clauses.put_nowait(None)
        except* ApiError as failed:  # the backend failed mid-stream (a remote one went down), or a memory round
            raise failed.exceptions[0] from None
        except* ContentFiltered as filtered:  # the speech task is cancelled with it: nothing more is said
            raise filtered.exceptions[0] from None
        finally:
            if self._memory is not None:  # what the model saved
                self.events.metadata = {**(self.events.metadata or {}), **self._memory.metadata()}
        return await deltas.result()

    def release_held(self) -> None:
        """A cancelled text reply (its task stopped): the text the policy still held, screened as the end of the
        reply, goes out as its last delta, so the item holds everything generated before the cancel."""
        if self.speech is None and not self.job.tool_use.tools and self.events.opened:
            if text := self.guard.flush():
                self.text_delta(text)

    def cancel_generation(self) -> None:
        if self.stream is not None:
            self.stream.cancel()
        if self.job.preemption is not None:  # cancelled before run() took or dropped it
            self.job.preemption.cancel()

    async def _speak(self, clauses: asyncio.Queue[str | None]) -> None:
        assert self.tts is not None and self.speech is not None
        item = self.events.item
        while (clause := await clauses.get()) is not None:
            start_ms = item.audio_ms_sent
            first = not item.spoken
            # Only the first clause can have been spoken ahead, by an adopted preemption.
            made_ahead = None
            if first and self._adopted is not None and self._adopted.speech_speed == self.job.speech_speed:
                made_ahead = await self._adopted.audio_for(clause)
            speed = self.job.speech_speed
            audio = self._iterate(made_ahead) if made_ahead is not None else self.tts.synthesize(clause, first_clause=first, speed=speed)
            synthesis_started = time.perf_counter()
            async for pcm in audio:
                self.speech.write(pcm)
                item.audio_ms_sent += 1000.0 * len(pcm) / self.tts.sample_rate
            if made_ahead is None:
                metrics.TTS_CLAUSE_SECONDS.observe(time.perf_counter() - synthesis_started)
            item.spoken.append(SpokenSegment(clause, start_ms, item.audio_ms_sent))
        self.speech.close()

    @staticmethod
    async def _iterate(chunks: list[np.ndarray]) -> AsyncIterator[np.ndarray]:
        for chunk in chunks:
            yield chunk
