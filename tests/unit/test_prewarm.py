"""The pre-warmer's bounds per key, against a stand-in engine: prefills in flight, and prepared prefixes
kept pinned (the oldest finished one is unpinned first; other keys' are never touched)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import cast

import pytest

from gateway.generation.prewarm import PINNED_PER_KEY, PREPARES_PER_KEY, Prewarmer
from gateway.protocol.errors import ApiError
from inference.llm.backend import LLMBackend


class Engine:
    """What the pre-warmer asks of an engine: background prefills it can finish, pins it can end."""

    def __init__(self) -> None:
        self.prefills: dict[str, asyncio.Future[int]] = {}
        self.ended: list[str] = []

    def prefill(self, prompt_ids: Sequence[int], *, conversation_id: str, background: bool = False) -> asyncio.Future[int]:
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self.prefills[conversation_id] = future
        return future

    def end_conversation(self, conversation_id: str) -> None:
        self.ended.append(conversation_id)

    def finish(self, conversation_id: str) -> None:
        self.prefills[f"prepare:{conversation_id}"].set_result(10)


def pinned(prewarmer: Prewarmer, owner: str, conversations: list[str]) -> list[str]:
    return [c for c in conversations if prewarmer.prepared_tokens(owner, c, list(range(20))) > 0]


async def test_a_key_keeps_its_newest_prepares_pinned_and_no_other_keys() -> None:
    fake, prewarmer = Engine(), Prewarmer()
    engine = cast(LLMBackend, fake)
    prewarmer.prepare(engine, "key_b", "conv_b", list(range(20)))
    fake.finish("conv_b")
    storm = [f"conv_a{n}" for n in range(PINNED_PER_KEY + 3)]
    for conversation in storm:
        prewarmer.prepare(engine, "key_a", conversation, list(range(20)))
        fake.finish(conversation)
    assert pinned(prewarmer, "key_a", storm) == storm[-PINNED_PER_KEY:], "the newest stay pinned"
    assert fake.ended == [f"prepare:{c}" for c in storm[:3]], "the oldest were unpinned, oldest first"
    assert pinned(prewarmer, "key_b", ["conv_b"]) == ["conv_b"]

    # Prefills in flight are bounded (429), and are never the ones unpinned.
    running = [f"conv_r{n}" for n in range(PREPARES_PER_KEY)]
    for conversation in running:
        prewarmer.prepare(engine, "key_a", conversation, list(range(20)))
    with pytest.raises(ApiError) as refused:
        prewarmer.prepare(engine, "key_a", "conv_more", list(range(20)))
    assert refused.value.code == "too_many_prepares"
    assert not any(fake.prefills[f"prepare:{c}"].cancelled() for c in running)
    assert len(pinned(prewarmer, "key_a", storm)) == PINNED_PER_KEY - PREPARES_PER_KEY
    prewarmer.close()
