"""The generation service's own logic (gateway/generation/service.py), over a backend that records what it is asked
and GenerationStreams fed by hand: errors mapped to ApiError at submit and mid-stream, the token quota settled
whatever the end, and the `remember` tool's second round rendered and submitted as the first."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from gateway.generation import service as generation
from gateway.generation.memory import Recall
from gateway.generation.service import Generator, MemoryRound, PromptSpec, Rendered
from gateway.platform.ratelimit import RateLimiter
from gateway.platform.storage.schema import MemoryRow
from gateway.platform.token_quota import TokenAccount, TokenQuota
from gateway.protocol.errors import ApiError
from gateway.safety.policy import SafetyPolicy
from inference.llm.backend import (
    BackendRejected,
    BackendUnavailable,
    EngineOverloaded,
    GenerationResult,
    GenerationStream,
    SamplingParams,
)
from inference.llm.chat import ChatMessage, RenderedPrompt
from inference.llm.routing import routing_key

TPM = 1000
REMEMBER = '<tool_call>[{"name": "remember", "arguments": {"fact": "my dog is Rex"}}]</tool_call>'


class FakeLM:
    tool_format = "list"


class FakeBackend:
    """Submits hand back the streams queued in `replies` (or raise `refuse`), and record their arguments."""

    def __init__(self, *replies: GenerationStream, refuse: Exception | None = None) -> None:
        self.lm = FakeLM()
        self.replies = list(replies)
        self.refuse = refuse
        self.submitted: list[dict[str, Any]] = []

    def submit(self, prompt_ids: Sequence[int], params: SamplingParams, *, conversation_id: str | None = None,
               constraint: object = None, background: bool = False,
               messages: Sequence[Mapping[str, Any]] | None = None) -> GenerationStream:
        if self.refuse is not None:
            raise self.refuse
        self.submitted.append({"ids": list(prompt_ids), "max_tokens": params.max_tokens, "pin": conversation_id,
                               "routing": routing_key(conversation_id), "background": background})
        return self.replies.pop(0)


def finished(text: str, tokens: int, prompt: int = 10) -> GenerationStream:
    stream = GenerationStream("r", asyncio.get_running_loop())
    for piece in [text[i:i + 7] for i in range(0, len(text), 7)]:
        stream.deliver(piece, None, None)
    stream.deliver(None, GenerationResult(text, [1] * tokens, "stop", prompt, tokens, 0, 1.0, 1.1, 2.0), None)
    return stream


def account() -> TokenAccount:
    return TokenAccount(TokenQuota(TPM, RateLimiter(0)), "key_1")


def service(backend: FakeBackend) -> Generator:
    return Generator(backend, SafetyPolicy([]))  # type: ignore[arg-type]


async def prepared_for(generator: Generator, prompt_tokens: int = 10, max_tokens: int = 20,
                       invalid_param: str | None = None) -> generation.Prepared:
    return await generator.reserve(Rendered(RenderedPrompt(list(range(prompt_tokens)))),
                                   SamplingParams(max_tokens=max_tokens), account(), invalid_param=invalid_param)


@pytest.mark.parametrize(("error", "code", "status"), [
    (EngineOverloaded(2.0), "server_overloaded", 429),
    (BackendUnavailable("down"), "backend_unavailable", 503),
    (BackendRejected(400, "the prompt lists 1, 2, 3"), "backend_error", 502),
])
async def test_a_submit_the_backend_refuses_is_an_api_error_and_charges_the_prompt_only(
    error: Exception, code: str, status: int
) -> None:
    generator = service(FakeBackend(refuse=error))
    prepared = await prepared_for(generator)
    assert prepared.reservation is not None and prepared.reservation.remaining == pytest.approx(TPM - 30, abs=1)
    with pytest.raises(ApiError) as refused:
        await generator.start(prepared)
    assert (refused.value.code, refused.value.status) == (code, status)
    assert "1, 2, 3" not in refused.value.message  # a remote server's words never reach the client
    assert prepared.reservation.settled and prepared.reservation.remaining == pytest.approx(TPM - 10, abs=1)


async def test_a_value_error_names_the_prompt_only_where_the_caller_says_which_field_it_is() -> None:
    generator = service(FakeBackend(refuse=ValueError("token id 99999 is past the vocabulary")))
    with pytest.raises(ApiError) as refused:
        await generator.start(await prepared_for(generator, invalid_param="prompt"))
    assert (refused.value.code, refused.value.param) == ("invalid_value", "prompt")
    with pytest.raises(ValueError):  # elsewhere it is the gateway's bug, not the client's
        await generator.start(await prepared_for(generator))


async def test_a_failure_mid_stream_is_an_api_error_and_the_streamed_deltas_are_charged() -> None:
    stream = GenerationStream("r", asyncio.get_running_loop())
    for delta in ("a", "b", "c"):
        stream.deliver(delta, None, None)
    stream.deliver(None, None, BackendUnavailable("the worker went away"))
    generator = service(FakeBackend(stream))
    prepared = await prepared_for(generator)
    reply = await generator.start(prepared)
    seen: list[str] = []
    with pytest.raises(ApiError) as failed:
        async for delta in reply:
            seen.append(delta)
    assert seen == ["a", "b", "c"] and failed.value.code == "backend_unavailable"
    with pytest.raises(ApiError):
        await reply.result()
    await reply.close()
    assert prepared.reservation is not None and prepared.reservation.remaining == pytest.approx(TPM - 13, abs=1)


async def test_a_finished_reply_gives_back_what_it_did_not_generate() -> None:
    generator = service(FakeBackend(finished("Paris.", 4)))
    prepared = await prepared_for(generator)
    reply = await generator.start(prepared, routing_key="conv_1")
    assert "".join([delta async for delta in reply]) == "Paris."
    assert (await reply.result()).completion_tokens == 4
    await reply.close()
    await reply.close()  # settled once
    assert prepared.reservation is not None and prepared.reservation.remaining == pytest.approx(TPM - 14, abs=1)


class ListStore:
    def __init__(self) -> None:
        self.rows: list[MemoryRow] = []

    async def add(self, owner: str, content: str) -> MemoryRow:
        self.rows.append(MemoryRow(id=f"mem_{len(self.rows)}", owner=owner, content=content, created_at=0.0))
        return self.rows[-1]


async def test_the_second_round_is_rendered_from_the_saved_calls_and_submitted_on_the_same_route(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rendered: list[tuple[list[ChatMessage], int]] = []

    def render(lm: object, spec: PromptSpec, max_tokens: int) -> Rendered:
        rendered.append((spec.messages, max_tokens))
        return Rendered(RenderedPrompt([7] * (40 + len(spec.messages))))

    monkeypatch.setattr(generation, "render", render)
    backend = FakeBackend(finished(REMEMBER, 12), finished("Noted, Rex.", 3, prompt=43))
    generator = service(backend)
    store = ListStore()
    memory = MemoryRound(Recall(store=store, owner="key_1"), [],  # type: ignore[arg-type]
                         lambda added: PromptSpec([ChatMessage("user", "my dog is Rex"), *added]))
    prepared = await prepared_for(generator, max_tokens=32)
    reply = await generator.start(prepared, conversation_id="conv_1", memory=memory)
    assert "".join([delta async for delta in reply]) == "Noted, Rex."
    result = await reply.result()
    await reply.close()

    assert [row.content for row in store.rows] == ["my dog is Rex"]
    ((messages, left),) = rendered
    assert left == 32 - 12 and messages[0].content == "my dog is Rex" and len(messages) > 1
    first, second = backend.submitted
    assert second["max_tokens"] == 20 and second["pin"] == first["pin"] == "conv_1"
    assert second["routing"] == "conv_1"
    assert (result.prompt_tokens, result.completion_tokens) == (10 + 43, 15)
    assert prepared.reservation is not None  # both rounds used more than was reserved: nothing goes back
    assert prepared.reservation.settled and prepared.reservation.remaining == pytest.approx(TPM - 42, abs=1)
