"""One generation path for every API: chat completions, /v1/completions, the conversation stream, Realtime
responses, voice preemption and titles.

- `prepare()` renders the prompt and compiles its grammar in a worker thread (both block), then reserves the
  key's tokens (token_quota.py).
- `start()` submits it with its routing key (inference/llm/routing.py), or reads a generation already running
  for it (an adopted preemption), and when the model may save memories it runs the `remember` tool's rounds
  (memory_tool.py), the second one through the same render and submit.
- The `Reply` it returns is what the caller reads. The backend's errors, at submit or mid-stream, come out of
  it as ApiError: this module is the only place that maps them (llm_errors.py). `close()` stops what still
  runs and settles the reservation.
- `guard()`: the safety policy on the reply as it streams, and the classifier beside it (safety/output.py).

Input screening stays with the callers: each screens its own input (messages, a draft, a prompt, Realtime
items) before it is stored or recalled from, with the field a refusal names.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from gateway.generation.llm_errors import BACKEND_ERRORS, backend_api_error
from gateway.generation.memory import Recall
from gateway.generation.memory_tool import Generation, MemoryToolStream, ReplyStream
from gateway.platform.token_quota import Reservation, TokenAccount
from gateway.protocol.errors import ApiError
from gateway.safety.hooks import Classifier, ClassifierWatch
from gateway.safety.output import OutputGuard
from gateway.safety.policy import SafetyPolicy
from inference.llm.backend import GenerationResult, GenerationStream, LLMBackend, PromptModel, SamplingParams
from inference.llm.chat import ChatMessage, ContextOverflow, RenderedPrompt, render_prompt
from inference.llm.constraints import GrammarError, TokenConstraint
from inference.llm.routing import routed
from inference.llm.tool_calls import ToolSpec

if TYPE_CHECKING:
    from gateway.platform.latency import TurnMarks


@contextmanager
def backend_errors(invalid_param: str | None = None) -> Iterator[None]:
    """Where the backend's errors become what the client is told. `invalid_param`: the field a ValueError
    of the backend's blames (a token-id prompt's id past the vocabulary); without it a ValueError is a bug."""
    try:
        yield
    except BACKEND_ERRORS as exc:
        raise backend_api_error(exc) from None
    except ValueError as exc:
        if invalid_param is None:
            raise
        raise ApiError("invalid_value", str(exc), invalid_param) from None


@dataclass(frozen=True)
class PromptSpec:
    """A reply's prompt before it is rendered, and the fields its errors name."""

    messages: list[ChatMessage]
    template_tools: list[dict[str, Any]] | None = None  # for a chat template that renders tools
    grammar: str | None = None  # llguidance Lark the output must match (constraints.py); None: unconstrained
    param: str | None = None  # what a prompt past the context window blames
    grammar_param: str | None = "tools"  # what a grammar that cannot be compiled blames, and in what words
    grammar_message: str = "The JSON schema cannot be used"


@dataclass(frozen=True)
class Rendered:
    prompt: RenderedPrompt
    constraint: TokenConstraint | None = None


def render(lm: PromptModel, spec: PromptSpec, max_tokens: int) -> Rendered:
    """Blocking (tokenizer, grammar compiler): run it in a thread (Generator.render)."""
    try:
        prompt = render_prompt(lm.tokenizer, spec.messages, context_window=lm.context_window, reserve_tokens=max_tokens,
                               tools=spec.template_tools, tool_format=lm.tool_format)
    except ContextOverflow as exc:
        raise ApiError("context_length_exceeded", str(exc), spec.param) from None
    try:
        constraint = lm.grammars.constraint(spec.grammar) if spec.grammar is not None else None
    except GrammarError as exc:
        raise ApiError("invalid_value", f"{spec.grammar_message}: {exc}", spec.grammar_param) from None
    return Rendered(prompt, constraint)


@dataclass
class Prepared:
    """A prompt ready to submit, its tokens reserved (`reservation` is None without a token limit)."""

    rendered: Rendered
    sampling: SamplingParams
    reservation: Reservation | None = None
    invalid_param: str | None = None  # see backend_errors

    @property
    def prompt_ids(self) -> list[int]:
        return self.rendered.prompt.token_ids


@dataclass(frozen=True)
class MemoryRound:
    """The built-in `remember` tool is offered: its calls run out of the client's sight, then the reply goes on
    in a second round (memory_tool.py) whose prompt `second` builds from the calls and their results."""

    recall: Recall
    client_tools: list[ToolSpec]  # what else the reply is parsed for
    second: Callable[[list[ChatMessage]], PromptSpec]


class Reply:
    """One reply as its caller reads it: text deltas, then `result()`. Errors of the backend are ApiError
    here; `close()` (always, at the end) cancels what still runs and settles the reservation: what was not
    generated goes back, and a reply that failed or was cancelled is charged for the deltas it streamed."""

    def __init__(self, stream: ReplyStream, reservation: Reservation | None) -> None:
        self._stream = stream
        self.reservation = reservation
        self.deltas = 0
        self._result: GenerationResult | None = None

    def __aiter__(self) -> AsyncIterator[str]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[str]:
        with backend_errors():
            async for delta in self._stream:
                self.deltas += 1
                yield delta

    async def result(self) -> GenerationResult:
        with backend_errors():
            self._result = await self._stream.result()
        return self._result

    def cancel(self) -> None:
        self._stream.cancel()

    def pace(self, not_needed_before: float) -> None:
        """No token is needed before this time.monotonic() (GenerationStream.pace)."""
        self._stream.pace(not_needed_before)

    async def close(self) -> None:
        self._stream.cancel()  # a no-op once finished
        if self.reservation is not None:
            await self.reservation.settle(self._result, self.deltas)


class Generator:
    def __init__(self, engine: LLMBackend, safety: SafetyPolicy, classifier: Classifier | None = None,
                 classifier_timeout_s: float = 2.0) -> None:
        self.engine = engine
        self.safety = safety
        self.classifier = classifier
        self.classifier_timeout_s = classifier_timeout_s

    async def render(self, spec: PromptSpec, max_tokens: int) -> Rendered:
        return await asyncio.to_thread(render, self.engine.lm, spec, max_tokens)

    async def prepare(self, spec: PromptSpec, sampling: SamplingParams, tokens: TokenAccount | None = None) -> Prepared:
        """Rendered for `sampling.max_tokens` of output, and those plus the prompt's reserved (429 past the
        key's tokens per minute)."""
        rendered = await self.render(spec, sampling.max_tokens)
        return await self.reserve(rendered, sampling, tokens)

    async def reserve(self, rendered: Rendered, sampling: SamplingParams, tokens: TokenAccount | None = None, *,
                      invalid_param: str | None = None) -> Prepared:
        """A prompt rendered already (a /v1/completions prompt is its token ids)."""
        reservation = await tokens.reserve(len(rendered.prompt.token_ids), sampling.max_tokens) if tokens else None
        return Prepared(rendered, sampling, reservation, invalid_param)

    async def start(self, prepared: Prepared, *, routing_key: str | None = None, conversation_id: str | None = None,
                    background: bool = False, memory: MemoryRound | None = None,
                    adopted: Generation | None = None) -> Reply:
        """Submit the prompt, or read `adopted` (its generation, already running). `routing_key`: the HTTP
        APIs' conversation, which routes without pinning; `conversation_id`: a Realtime session's, which pins
        its KV too (routing.py). A submit that fails settles the reservation and raises ApiError."""

        def submit(rendered: Rendered, sampling: SamplingParams) -> GenerationStream:
            with backend_errors(prepared.invalid_param), routed(routing_key):
                return self.engine.submit(rendered.prompt.token_ids, sampling, conversation_id=conversation_id,
                                          constraint=rendered.constraint, background=background,
                                          messages=rendered.prompt.messages)

        try:
            first = adopted if adopted is not None else submit(prepared.rendered, prepared.sampling)
        except Exception:
            if prepared.reservation is not None:
                await prepared.reservation.settle(None)
            raise
        if memory is None:
            return Reply(first, prepared.reservation)

        async def follow_up(added: list[ChatMessage], left: int) -> GenerationStream:
            """The second round: `left` tokens of what the first did not use, the same routing."""
            rendered = await self.render(memory.second(added), left)
            return submit(rendered, replace(prepared.sampling, max_tokens=left))

        rounds = MemoryToolStream(first, memory.recall, self.safety, follow_up, client_tools=memory.client_tools,
                                  tool_format=self.engine.lm.tool_format, max_tokens=prepared.sampling.max_tokens)
        return Reply(rounds, prepared.reservation)

    def guard(self, stop: Callable[[], None], *, json_output: bool = False,
              marks: TurnMarks | None = None) -> OutputGuard:
        """The policy's rules on the reply as it streams, and the classifier beside them, which calls `stop`
        when it flags the turn. `json_output`: the reply is constrained to JSON, which its labels keep."""
        watch = ClassifierWatch.maybe(self.classifier, stop=stop, timeout_s=self.classifier_timeout_s, marks=marks)
        return OutputGuard(self.safety, watch, json_output=json_output)
