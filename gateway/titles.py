"""A conversation's title, written by the model after the first exchange, at background priority (it
never takes the engine from a live reply: LLMEngine.submit(background=True))."""

from __future__ import annotations

import asyncio
import re

from inference.llm.chat import ChatMessage, render_prompt
from inference.llm.engine import LLMEngine, SamplingParams

TITLE_INSTRUCTIONS = ("Write a title of three to six words for a conversation that starts with the user's "
                      "message below. Reply with the title only.")
MAX_TITLE_CHARS = 80


def clean_title(text: str) -> str | None:
    """The model's first line without quotes, a 'Title:' label or final punctuation; None if nothing is left."""
    line = next((line for line in text.strip().splitlines() if line.strip()), "")
    line = re.sub(r"^\s*(title\s*:)\s*", "", line, flags=re.IGNORECASE).strip().strip("\"'*#").strip()
    line = line.rstrip(".!?:;,").strip()
    return line[:MAX_TITLE_CHARS] or None


async def generate_title(engine: LLMEngine, question: str) -> str | None:
    messages = [ChatMessage("system", TITLE_INSTRUCTIONS), ChatMessage("user", question[:2000])]
    prompt = await asyncio.to_thread(render_prompt, engine.lm.tokenizer, messages,
                                     context_window=engine.lm.context_window, reserve_tokens=16)
    stream = engine.submit(prompt.token_ids, SamplingParams(temperature=0.0, max_tokens=16), background=True)
    try:
        return clean_title((await stream.result()).text)
    finally:
        stream.cancel()
