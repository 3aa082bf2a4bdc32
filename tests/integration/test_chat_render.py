"""Prompt rendering with the real tokenizer: the model's own chat template and context trimming."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from inference.llm.chat import ChatMessage, ContextOverflow, draft_prompt_ids, render_prompt
from inference.llm.loader import LoadedLM, load_lm
from inference.models import embedded_llm


@pytest.fixture(scope="module")
def lm() -> LoadedLM:
    cache = Path(os.environ.get("GATEWAY_CACHE_DIR", Path.home() / ".cache" / "realtime-gateway"))
    return load_lm(embedded_llm(), cache_dir=cache)


def test_template_comes_from_the_tokenizer(lm: LoadedLM) -> None:
    prompt = render_prompt(lm.tokenizer, [ChatMessage("user", "Hi")], context_window=8192, reserve_tokens=10)
    text = lm.tokenizer.decode(prompt.token_ids)
    assert text.endswith("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")


def test_system_and_developer_merge_into_one_leading_system_message(lm: LoadedLM) -> None:
    messages = [ChatMessage("user", "Hi"), ChatMessage("developer", "Be terse."), ChatMessage("system", "Speak English.")]
    prompt = render_prompt(lm.tokenizer, messages, context_window=8192, reserve_tokens=10)
    text = lm.tokenizer.decode(prompt.token_ids)
    assert text.startswith("<|im_start|>system\nBe terse.\n\nSpeak English.<|im_end|>")


def test_oldest_turns_are_dropped_but_instructions_kept(lm: LoadedLM) -> None:
    turns = []
    for index in range(10):
        turns += [ChatMessage("user", f"turn {index} " + "word " * 100), ChatMessage("assistant", f"reply {index}")]
    messages = [ChatMessage("system", "KEEP THIS"), *turns, ChatMessage("user", "last question")]
    prompt = render_prompt(lm.tokenizer, messages, context_window=800, reserve_tokens=100)
    text = lm.tokenizer.decode(prompt.token_ids)
    assert len(prompt.token_ids) <= 700 and prompt.dropped_messages > 0
    assert "KEEP THIS" in text and "last question" in text and "turn 0 " not in text
    # The kept history starts with a user turn, never an orphan assistant reply.
    assert prompt.messages[1]["role"] == "user"


def test_overflow_of_the_newest_message_is_an_error(lm: LoadedLM) -> None:
    with pytest.raises(ContextOverflow):
        render_prompt(lm.tokenizer, [ChatMessage("user", "word " * 2000)], context_window=512, reserve_tokens=64)


def test_draft_ids_are_a_prefix_of_the_finished_prompt(lm: LoadedLM) -> None:
    history = [ChatMessage("system", "Be brief."), ChatMessage("user", "Hello"), ChatMessage("assistant", "Hi!")]
    draft = draft_prompt_ids(lm.tokenizer, history, "What is the capital")
    final = render_prompt(
        lm.tokenizer, [*history, ChatMessage("user", "What is the capital of France?")], context_window=8192, reserve_tokens=10
    ).token_ids
    assert len(draft) > 10 and final[: len(draft)] == draft
