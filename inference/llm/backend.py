"""The LLM backend contract: what the gateway asks of an LLM, whichever engine runs it.

The gateway renders every prompt itself (chat template, tools, context trimming) and hands a backend
token ids, so that a conversation's prefix stays byte-identical from turn to turn and every prefix cache
behind the backend hits (the seam vLLM v1 draws between its front end and its engine core). A backend:

- ``submit``: queue one generation, returning at once with a :class:`GenerationStream` of text deltas;
- ``GenerationStream.cancel``: stop it at the next token (a barge-in, a client that left);
- ``prefill``: compute a prompt's KV ahead of its request (early prefill while the user speaks or types);
- ``end_conversation``: the conversation is over, its cached KV need not be kept for it.

Implementations: :class:`inference.llm.engine.LLMEngine` (in process) and
:class:`inference.llm.remote.RemoteBackend` (an OpenAI-compatible server: vLLM, SGLang, another gateway).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Literal, Protocol

if TYPE_CHECKING:  # pragma: no cover
    from transformers import PreTrainedTokenizerBase

    from .constraints import GrammarCompiler, TokenConstraint
    from .tool_calls import ToolFormat

FinishReason = Literal["stop", "length", "cancelled"]


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.7  # 0 => greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 => off
    repetition_penalty: float = 1.1
    seed: int | None = None
    max_tokens: int = 256
    stop: tuple[str, ...] = ()  # stop strings; never emitted to the client
    ignore_eos: bool = False  # addition: never sample EOS (fixed-length generations for benchmarks)
    presence_penalty: float = 0.0  # OpenAI's, over the generated tokens
    frequency_penalty: float = 0.0
    # Addition: report the model's probability of these tokens at the first step, before any processor
    # (GenerationResult.first_step_probability; end_of_turn.py asks for the end-of-message token's).
    probe_ids: tuple[int, ...] = ()


DEFAULT_SAMPLING = SamplingParams()


@dataclass
class GenerationResult:
    text: str
    token_ids: list[int]  # every sampled token, the final EOS token included (empty where a server hides them)
    finish_reason: FinishReason
    prompt_tokens: int
    completion_tokens: int
    cached_prompt_tokens: int
    submitted_at: float
    first_token_at: float | None
    finished_at: float  # time.monotonic()
    first_step_probability: float | None = None  # of SamplingParams.probe_ids
    admitted_at: float | None = None  # when the engine took it from its queue (queue wait: - submitted_at)


class EngineOverloaded(Exception):
    """The admission queue is full. Map it to HTTP 429/503 with ``Retry-After`` or a WebSocket error event."""

    def __init__(self, retry_after_s: float, message: str | None = None) -> None:
        self.retry_after_s = float(retry_after_s)
        super().__init__(message or f"LLM engine overloaded: admission queue full; retry after {retry_after_s:.1f} s")


class EngineClosed(Exception):
    """The engine is closed (or closing): no new requests."""


class BackendUnavailable(Exception):
    """A remote backend cannot be reached (down, timing out, or its circuit breaker is open): HTTP 503
    with ``Retry-After``, or a ``backend_unavailable`` error event. The session itself goes on."""

    def __init__(self, message: str, retry_after_s: float = 1.0) -> None:
        self.retry_after_s = float(retry_after_s)
        super().__init__(message)


class BackendRejected(Exception):
    """A remote server refused the request itself (a 4xx other than 429): a gateway/server mismatch, such
    as an unknown model name or a prompt past the server's context, not a passing fault (HTTP 502)."""

    def __init__(self, status: int, message: str) -> None:
        self.status = status
        super().__init__(f"The LLM backend refused the request ({status}): {message}")


class UnsupportedByBackend(ValueError):
    """A request this backend cannot carry out faithfully (a grammar constraint sent to a server that
    takes none): refused, never silently run without it."""


_END = object()


class GenerationStream:
    """The client side of one generation request (lives on the event loop). A backend delivers with
    :meth:`deliver` on the stream's loop and learns of a cancel through ``on_cancel``.

    ``so_far``: the request's result as it stands (its tokens generated until now). With it, a cancel
    answers :meth:`result` at once with those counts, instead of when the backend stops the request (the
    in-process engine's next step: 20-30 ms with 8 streams, which a barge-in's response.done waited for).
    """

    def __init__(self, request_id: str, loop: asyncio.AbstractEventLoop,
                 on_cancel: Callable[[], object] | None = None,
                 on_pace: Callable[[float], object] | None = None,
                 so_far: Callable[[], GenerationResult] | None = None) -> None:
        self.request_id = request_id
        self._loop = loop
        self._queue: asyncio.Queue = asyncio.Queue()
        self._result: asyncio.Future = loop.create_future()
        self._on_cancel = on_cancel
        self._on_pace = on_pace
        self._so_far = so_far
        self._delivered: list[str] = []
        self.cancelled = False

    # Called on the event loop.
    def deliver(self, delta: str | None, result: GenerationResult | None, error: BaseException | None) -> None:
        if delta:
            self._queue.put_nowait(delta)
            self._delivered.append(delta)
        if error is not None:
            self._queue.put_nowait(error)
            if not self._result.done():
                self._result.set_exception(error)
                self._result.exception()  # mark retrieved: the iterator may be the one that reports it
        elif result is not None:
            self._queue.put_nowait(_END)
            if not self._result.done():
                self._result.set_result(result)

    def __aiter__(self) -> AsyncIterator[str]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[str]:
        while True:
            if self._result.done() and self._queue.empty():
                error = self._result.exception()
                if error is not None:
                    raise error
                return
            item = await self._queue.get()
            if item is _END:
                return
            if isinstance(item, BaseException):
                raise item
            yield item

    async def result(self) -> GenerationResult:
        return await asyncio.shield(self._result)

    def cancel(self) -> None:
        """Thread-safe, idempotent: generation stops at the next step (finish_reason "cancelled")."""
        if self.cancelled or self._result.done():
            return
        self.cancelled = True
        if self._on_cancel is not None:
            self._on_cancel()
        if self._so_far is not None:
            try:
                on_loop = asyncio.get_running_loop() is self._loop
            except RuntimeError:
                on_loop = False
            if on_loop:
                self._answer_cancel()
            else:
                self._loop.call_soon_threadsafe(self._answer_cancel)

    def _answer_cancel(self) -> None:
        """On the loop: the result as it stands, with the text this stream delivered (the reader's, to the
        last delta): tokens whose text the backend had not sent yet count, as they were generated."""
        assert self._so_far is not None
        if not self._result.done():
            self.deliver(None, replace(self._so_far(), text="".join(self._delivered)), None)

    def pace(self, not_needed_before: float) -> None:
        """The reader needs no further token before this ``time.monotonic()`` (a spoken reply whose audio
        already made plays until later): the in-process engine leaves the request out of steps that other
        requests need sooner, until then. A remote server generates at its own rate (no ``on_pace``)."""
        if self._on_pace is not None and not self._result.done():
            self._on_pace(not_needed_before)


class PromptModel(Protocol):
    """What the gateway needs of a model to render its prompts and read its replies: a tokenizer with
    its chat template, not weights (a remote backend runs those)."""

    tokenizer: PreTrainedTokenizerBase
    context_window: int
    eos_token_ids: frozenset[int]
    tool_format: ToolFormat
    grammars: GrammarCompiler


class LLMBackend(Protocol):
    @property
    def lm(self) -> PromptModel:
        """The tokenizer and the facts a prompt is rendered with (read-only: backends hold richer models)."""
        ...

    def start(self) -> None: ...

    def close(self, timeout: float = 10.0) -> None: ...

    def submit(
        self, prompt_ids: Sequence[int], params: SamplingParams = DEFAULT_SAMPLING, *,
        conversation_id: str | None = None, constraint: TokenConstraint | None = None, background: bool = False,
        messages: Sequence[Mapping[str, Any]] | None = None,
    ) -> GenerationStream:
        """Queue a generation; returns at once. Raises EngineOverloaded, EngineClosed, BackendUnavailable,
        UnsupportedByBackend or ValueError (a bad prompt or parameter). ``messages``: the chat the ids were
        rendered from, for a backend that templates on its side (the chat flavour of remote.py)."""
        ...

    def prefill(self, prompt_ids: Sequence[int], *, conversation_id: str, background: bool = False,
                messages: Sequence[Mapping[str, Any]] | None = None) -> asyncio.Future[int]:
        """Warm the KV of ``prompt_ids`` for the conversation's next request; resolves to the number of
        tokens computed (0 when all were cached, or when the backend cannot tell)."""
        ...

    def end_conversation(self, conversation_id: str) -> None: ...

    def stats(self) -> dict[str, float]: ...

    def describe(self) -> dict[str, Any]:
        """What runs the LLM, for /healthz and the log."""
        ...
