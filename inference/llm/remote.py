"""The LLM on a remote OpenAI-compatible server (vLLM, SGLang, another gateway, llama.cpp's server, ...).

Two flavours:

- ``token``: ``POST /v1/completions`` with the prompt as token ids, streamed. The gateway keeps
  rendering prompts (chat template, tools, trimming), so a conversation's prefix is byte-identical
  from turn to turn and the server's prefix cache hits. vLLM, SGLang and this gateway serve it.
- ``chat``: ``POST /v1/chat/completions`` with the messages the ids were rendered from, for servers that
  take no token ids (llama.cpp's server, ``transformers serve``, a hosted API).

Every request of a conversation carries its id in a routing header (``--llm-routing-header``; routing.py
says which), so a cache-aware router (SGLang's model gateway, vLLM's router) keeps a conversation on the
worker that caches it. A server's error body never reaches a client (it may list the prompt): the log
gets its redacted shape (:func:`redacted_body`), the client a message of the gateway's own. Cancelling a stream closes its connection: the server stops the request, and the conversation's next
request never waits for it. A request that fails before anything was streamed is retried (a restarting
server), one that breaks later is not (its text was seen); consecutive failures open a circuit breaker
that refuses at once for a cool-down (``BackendUnavailable``: HTTP 503 or an ``error`` event), then lets one
request probe the server.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import json
import logging
import re
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import httpx

from .backend import (
    DEFAULT_SAMPLING,
    BackendRejected,
    BackendUnavailable,
    EngineClosed,
    EngineOverloaded,
    FinishReason,
    GenerationResult,
    GenerationStream,
    PromptModel,
    SamplingParams,
    UnsupportedByBackend,
)
from .constraints import TokenConstraint
from .routing import routing_key

log = logging.getLogger(__name__)

Flavour = Literal["token", "chat"]
# Statuses a restarting or overloaded server answers before it streams: worth another try.
RETRYABLE_STATUSES = frozenset({502, 503, 504})
_FINISH_REASONS: dict[str, FinishReason] = {"stop": "stop", "length": "length", "abort": "cancelled"}


@dataclass(frozen=True)
class RemoteConfig:
    url: str  # the server's OpenAI API root, e.g. http://10.0.0.5:8000/v1
    flavour: Flavour = "token"
    model: str = "default"  # the model name the server serves
    api_key: str | None = None
    routing_header: str = "x-conversation-id"
    connect_timeout_s: float = 3.0
    read_timeout_s: float = 60.0  # the longest silence of a stream (before its first token too)
    retries: int = 2  # before anything was streamed
    retry_backoff_s: float = 0.2  # doubled on each retry
    breaker_failures: int = 3  # consecutive failures that open the breaker
    breaker_cooldown_s: float = 2.0
    max_in_flight: int = 256  # beyond this, EngineOverloaded (HTTP 429 / server_overloaded)


class _Breaker:
    """Consecutive failures open it for a cool-down; then one request at a time probes (half-open)."""

    def __init__(self, failures: int, cooldown_s: float) -> None:
        self.failures_to_open = failures
        self.cooldown_s = cooldown_s
        self.failures = 0
        self.opened_at: float | None = None
        self.probing = False
        self.times_opened = 0

    def admit(self) -> None:
        if self.opened_at is None:
            return
        left = self.opened_at + self.cooldown_s - time.monotonic()
        if left > 0 or self.probing:
            raise BackendUnavailable("The LLM backend is unavailable; retry shortly.", retry_after_s=max(left, 0.5))
        self.probing = True  # half-open: this request finds out whether the server is back

    def succeeded(self) -> None:
        self.failures, self.opened_at, self.probing = 0, None, False

    def failed(self) -> None:
        self.failures += 1
        self.probing = False
        if self.failures >= self.failures_to_open or self.opened_at is not None:
            if self.opened_at is None:
                self.times_opened += 1
                log.warning("LLM backend: %d failures in a row; refusing for %.1f s", self.failures, self.cooldown_s)
            self.opened_at = time.monotonic()

    @property
    def state(self) -> str:
        return "closed" if self.opened_at is None else ("half_open" if self.probing else "open")


class RemoteBackend:
    """:class:`inference.llm.backend.LLMBackend` over HTTP. Lives on the event loop that first uses it."""

    def __init__(self, lm: PromptModel, config: RemoteConfig) -> None:
        self.lm = lm
        self.config = config
        self._breaker = _Breaker(config.breaker_failures, config.breaker_cooldown_s)
        self._client: httpx.AsyncClient | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tasks: set[asyncio.Task] = set()
        self._ids = itertools.count(1)
        self._closed = False
        self._counts = dict.fromkeys(
            ("requests", "requests_finished", "requests_cancelled", "requests_failed", "retries", "tokens_generated",
             "prefill_requests"), 0)

    # -- the contract ----------------------------------------------------------------------------------
    def start(self) -> None:
        """Nothing to start: the HTTP client opens on the event loop of the first request."""

    def close(self, timeout: float = 10.0) -> None:
        """Cancel and await every request in flight, then close the connections. From any thread."""
        self._closed = True
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:  # on the loop itself: schedule it (owned by the loop's shutdown)
            loop.create_task(self.aclose())
            return
        try:
            asyncio.run_coroutine_threadsafe(self.aclose(), loop).result(timeout)
        except (concurrent.futures.TimeoutError, RuntimeError):
            log.warning("the LLM backend's requests did not stop within %.1f s", timeout)

    async def aclose(self) -> None:
        self._closed = True
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    def submit(
        self, prompt_ids: Sequence[int], params: SamplingParams = DEFAULT_SAMPLING, *,
        conversation_id: str | None = None, constraint: TokenConstraint | None = None, background: bool = False,
        messages: Sequence[Mapping[str, Any]] | None = None,
    ) -> GenerationStream:
        """Start a streamed request; returns at once. ``background`` is the remote server's to schedule:
        it runs as any request does there."""
        if constraint is not None:
            raise UnsupportedByBackend(
                "Grammar-constrained decoding (forced tool calls, response_format) is not available with a remote "
                "LLM backend.")
        if params.probe_ids:
            raise UnsupportedByBackend("Token probabilities are not available with a remote LLM backend.")
        body = self._body(prompt_ids, params, messages)
        loop = self._admit()
        rid = f"remote-{next(self._ids)}"
        # Cancelling closes the request's connection: the server stops it (any thread may cancel).
        stream = GenerationStream(rid, loop, on_cancel=lambda: loop.call_soon_threadsafe(task.cancel))
        task = self._spawn(self._generate(stream, body, routing_key(conversation_id), len(prompt_ids)), rid)
        return stream

    def prefill(self, prompt_ids: Sequence[int], *, conversation_id: str, background: bool = False,
                messages: Sequence[Mapping[str, Any]] | None = None) -> asyncio.Future[int]:
        """A 1-token request with the prompt: the server computes (and caches) its KV. Resolves to the
        prompt tokens it computed (its usage's prompt tokens less the cached ones)."""
        loop = self._admit()
        future: asyncio.Future[int] = loop.create_future()
        if self.config.flavour == "chat" and not messages:  # a draft with no chat to send: nothing to warm
            future.set_result(0)
            return future
        body = self._body(prompt_ids, SamplingParams(temperature=0.0, max_tokens=1), messages)
        self._counts["prefill_requests"] += 1
        task = self._spawn(self._prefill(future, body, routing_key(conversation_id)), f"prefill-{next(self._ids)}")
        future.add_done_callback(lambda f: task.cancel() if f.cancelled() else None)
        return future

    def end_conversation(self, conversation_id: str) -> None:
        """Nothing to tell the server: its prefix cache evicts a conversation nobody asks for again."""

    def stats(self) -> dict[str, float]:
        return {**self._counts, "in_flight": len(self._tasks), "breaker_open": float(self._breaker.state != "closed"),
                "breaker_times_opened": self._breaker.times_opened, "consecutive_failures": self._breaker.failures}

    def describe(self) -> dict[str, Any]:
        return {"backend": "remote", "url": self.config.url, "flavour": self.config.flavour, "model": self.config.model,
                "breaker": self._breaker.state}

    # -- requests --------------------------------------------------------------------------------------
    def _admit(self) -> asyncio.AbstractEventLoop:
        if self._closed:
            raise EngineClosed("the LLM backend is closed")
        loop = asyncio.get_running_loop()
        if self._loop is None:
            self._loop = loop
        if len(self._tasks) >= self.config.max_in_flight:
            raise EngineOverloaded(1.0, "the LLM backend has too many requests in flight")
        self._breaker.admit()
        return loop

    def _spawn(self, coro, name: str) -> asyncio.Task:
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        self._counts["requests"] += 1
        return task

    def _body(self, prompt_ids: Sequence[int], params: SamplingParams,
              messages: Sequence[Mapping[str, Any]] | None) -> dict[str, Any]:
        if not prompt_ids:
            raise ValueError("empty prompt")
        if len(prompt_ids) >= self.lm.context_window:
            raise ValueError(f"prompt of {len(prompt_ids)} tokens does not fit the context window of {self.lm.context_window}")
        if params.max_tokens < 1:
            raise ValueError("max_tokens must be >= 1")
        if params.temperature < 0:
            raise ValueError("temperature must be >= 0")
        body: dict[str, Any] = {
            "model": self.config.model, "stream": True, "stream_options": {"include_usage": True},
            "max_tokens": min(params.max_tokens, self.lm.context_window - len(prompt_ids)),
            "temperature": params.temperature, "top_p": params.top_p,
        }
        if self.config.flavour == "token":
            body["prompt"] = [int(t) for t in prompt_ids]
        elif messages:
            body["messages"] = [dict(m) for m in messages]
        else:
            raise UnsupportedByBackend("This request has no chat messages for a chat-flavoured LLM backend.")
        # Sent only when they change something: a server that knows no such field never sees it.
        optional = {"seed": params.seed, "stop": list(params.stop) or None,
                    "presence_penalty": params.presence_penalty or None,
                    "frequency_penalty": params.frequency_penalty or None}
        if self.config.flavour == "token":  # vLLM's and SGLang's sampling extensions (and this gateway's)
            optional |= {"top_k": params.top_k or None, "ignore_eos": params.ignore_eos or None,
                         "repetition_penalty": params.repetition_penalty if params.repetition_penalty != 1.0 else None}
        elif params.top_k or params.ignore_eos:
            raise UnsupportedByBackend("top_k and ignore_eos are not available with a chat-flavoured LLM backend.")
        # (The chat flavour sends OpenAI's fields only: the repetition penalty is the server's own.)
        body.update({k: v for k, v in optional.items() if v is not None})
        return body

    def _http(self) -> httpx.AsyncClient:
        if self._client is None:
            c = self.config
            headers = {"authorization": f"Bearer {c.api_key}"} if c.api_key else {}
            self._client = httpx.AsyncClient(
                base_url=c.url.rstrip("/"), headers=headers,
                timeout=httpx.Timeout(c.read_timeout_s, connect=c.connect_timeout_s),
                limits=httpx.Limits(max_connections=c.max_in_flight, max_keepalive_connections=32))
        return self._client

    async def _events(self, body: dict[str, Any], route: str | None,
                      streamed: list[bool]) -> AsyncIterator[dict[str, Any]]:
        """The server's SSE chunks, retried while ``streamed[0]`` is false (nothing reached the caller)."""
        path = "/completions" if self.config.flavour == "token" else "/chat/completions"
        headers = {self.config.routing_header: route} if route else {}
        attempt = 0
        while True:
            try:
                async with self._http().stream("POST", path, json=body, headers=headers) as response:
                    if response.status_code != 200:
                        await response.aread()
                        _raise_for_status(response)
                    finished = False  # some servers (transformers serve) end the stream without [DONE]
                    async for line in response.aiter_lines():
                        if not line.startswith("data:"):
                            continue
                        data = line[5:].strip()
                        if data == "[DONE]":
                            break
                        chunk = json.loads(data)
                        if "error" in chunk:
                            log.warning("the LLM backend failed mid-stream: %s", redacted_body(data.encode()))
                            raise BackendUnavailable("The LLM backend failed mid-stream.")
                        finished = finished or any(c.get("finish_reason") for c in chunk.get("choices") or ())
                        yield chunk
                    else:
                        if not finished:
                            raise BackendUnavailable("The LLM backend's stream ended before its reply did.")
                self._breaker.succeeded()
                return
            except (httpx.TransportError, BackendUnavailable, json.JSONDecodeError) as exc:
                self._breaker.failed()
                if streamed[0] or attempt >= self.config.retries or self._breaker.state == "open":
                    if isinstance(exc, BackendUnavailable):
                        raise
                    raise BackendUnavailable(f"The LLM backend is unavailable: {_describe(exc)}") from exc
                attempt += 1
                self._counts["retries"] += 1
                await asyncio.sleep(self.config.retry_backoff_s * 2 ** (attempt - 1))

    async def _generate(self, stream: GenerationStream, body: dict[str, Any], route: str | None,
                        prompt_tokens: int) -> None:
        submitted = time.monotonic()
        first_token_at: float | None = None
        texts: list[str] = []
        finish: FinishReason = "stop"
        usage: dict[str, Any] = {}
        streamed = [False]
        try:
            async for chunk in self._events(body, route, streamed):
                usage = chunk.get("usage") or usage
                for choice in chunk.get("choices") or ():
                    text = choice.get("text") if "text" in choice else (choice.get("delta") or {}).get("content")
                    if text:
                        if first_token_at is None:
                            first_token_at = time.monotonic()
                        streamed[0] = True
                        texts.append(text)
                        stream.deliver(text, None, None)
                    if choice.get("finish_reason"):
                        finish = _FINISH_REASONS.get(choice["finish_reason"], "stop")
        except asyncio.CancelledError:
            finish = "cancelled"
            self._counts["requests_cancelled"] += 1
        except BaseException as exc:  # noqa: BLE001 - every failure reaches the stream's reader
            self._counts["requests_failed"] += 1
            stream.deliver(None, None, _as_backend_error(exc))
            return
        completion = int(usage.get("completion_tokens") or len(texts))
        self._counts["requests_finished"] += 1
        self._counts["tokens_generated"] += completion
        details = usage.get("prompt_tokens_details") or {}
        stream.deliver(None, GenerationResult(
            text="".join(texts), token_ids=[], finish_reason=finish,
            prompt_tokens=int(usage.get("prompt_tokens") or prompt_tokens), completion_tokens=completion,
            cached_prompt_tokens=int(details.get("cached_tokens") or 0), submitted_at=submitted,
            first_token_at=first_token_at, finished_at=time.monotonic()), None)

    async def _prefill(self, future: asyncio.Future[int], body: dict[str, Any], route: str | None) -> None:
        usage: dict[str, Any] = {}
        try:
            async for chunk in self._events(body, route, [False]):
                usage = chunk.get("usage") or usage
        except asyncio.CancelledError:
            if not future.done():
                future.cancel()
            raise
        except BaseException as exc:  # noqa: BLE001
            if not future.done():
                future.set_exception(_as_backend_error(exc))
            return
        if not future.done():
            cached = int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
            future.set_result(max(0, int(usage.get("prompt_tokens") or 0) - cached))


def _raise_for_status(response: httpx.Response) -> None:
    """The error for a server's answer other than 200; its body goes to the log, redacted, and to no client."""
    status = response.status_code
    log.warning("the LLM backend answered %d to %s: %s", status, response.request.url.path,
                redacted_body(response.content))
    retry_after = _seconds(response.headers.get("retry-after"))
    if status == 429:
        raise EngineOverloaded(retry_after, "the LLM backend is busy")
    if status in RETRYABLE_STATUSES:  # restarting or overloaded: retried, and counted by the breaker
        raise BackendUnavailable(f"The LLM backend answered {status}; retry shortly.", retry_after_s=retry_after)
    # A 4xx or a 500: the server is up and refuses this request (llama.cpp's server answers token-id
    # prompts with 500), which no retry mends.
    raise BackendRejected(status, "its answer is in the gateway's log")


def _seconds(retry_after: str | None) -> float:
    try:
        return max(0.0, float(retry_after)) if retry_after else 1.0
    except ValueError:  # an HTTP date
        return 1.0


_SAFE_KEYS = frozenset({"message", "msg", "detail", "type", "code", "param", "object"})
# A message is kept up to where a server would quote or list what it refused (the prompt among it).
_MESSAGE_END = re.compile(r"""[:{\[(<"`]|(?<![A-Za-z])'|'(?![A-Za-z])""")
_NUMBERS = re.compile(r"\d+")


def redacted_body(content: bytes) -> str:
    """What the log may keep of a server's error body: the strings under an error's usual keys, each up to
    its first colon, bracket or quote and without numbers, for a server may echo the prompt (llama.cpp's
    server lists every token id, and a chat's messages, in its validation errors). The rest is left out."""
    try:
        body = json.loads(content)
    except ValueError:
        return f"{len(content)} bytes, not JSON"
    kept: dict[str, None] = {}  # ordered and deduplicated

    def walk(value: Any, key: str | None) -> None:
        if isinstance(value, dict):
            for k, v in value.items():
                walk(v, str(k))
        elif isinstance(value, list):
            if key == "loc":  # pydantic's path to the field, e.g. body.prompt.str
                kept[f"loc={'.'.join(part for part in value if isinstance(part, str))[:60]}"] = None
                return
            for item in value[:3]:
                walk(item, key)
        elif isinstance(value, str) and key in _SAFE_KEYS:
            kept[f"{key}={_NUMBERS.sub('#', _MESSAGE_END.split(value, maxsplit=1)[0]).strip()[:100]}"] = None

    walk(body, None)
    return f"{len(content)} bytes: " + ("; ".join(kept) if kept else "no message")


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def _as_backend_error(exc: BaseException) -> BaseException:
    """What a stream's reader gets: the contract's errors as they are, anything else as unavailability."""
    if isinstance(exc, (BackendUnavailable, EngineOverloaded, BackendRejected)):
        return exc
    return BackendUnavailable(f"The LLM backend failed: {_describe(exc)}")

