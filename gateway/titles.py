"""A conversation's title, written by the model after the first exchange, at background priority (it
never takes the engine from a live reply: LLMBackend.submit(background=True))."""

from __future__ import annotations

import asyncio
import logging
import re

from gateway.llm_errors import BACKEND_ERRORS
from gateway.safety.policy import SafetyPolicy
from gateway.storage.conversations import ConversationStore
from inference.llm.backend import LLMBackend, SamplingParams
from inference.llm.chat import ChatMessage, ContextOverflow, render_prompt

log = logging.getLogger(__name__)

TITLE_INSTRUCTIONS = ("Write a title of three to six words for a conversation that starts with the user's "
                      "message below. Reply with the title only.")
MAX_TITLE_CHARS = 80


def clean_title(text: str) -> str | None:
    """The model's first line without quotes, a 'Title:' label or final punctuation; None if nothing is left."""
    line = next((line for line in text.strip().splitlines() if line.strip()), "")
    line = re.sub(r"^\s*(title\s*:)\s*", "", line, flags=re.IGNORECASE).strip().strip("\"'*#").strip()
    line = line.rstrip(".!?:;,").strip()
    return line[:MAX_TITLE_CHARS] or None


async def generate_title(engine: LLMBackend, question: str, policy: SafetyPolicy) -> str | None:
    """The title, through the safety policy as any output of the model: redacted, or none when a rule blocks it."""
    messages = [ChatMessage("system", TITLE_INSTRUCTIONS), ChatMessage("user", question[:2000])]
    prompt = await asyncio.to_thread(render_prompt, engine.lm.tokenizer, messages,
                                     context_window=engine.lm.context_window, reserve_tokens=16)
    stream = engine.submit(prompt.token_ids, SamplingParams(temperature=0.0, max_tokens=16), background=True,
                           messages=prompt.messages)
    try:
        title = clean_title((await stream.result()).text)
    finally:
        stream.cancel()
    screened = policy.screen(title) if title is not None and policy else None
    if screened is None:
        return title
    return None if screened.blocked is not None else clean_title(screened.text)


def title_later(store: ConversationStore, engine: LLMBackend, owner: str, conversation_id: str, question: str,
                policy: SafetyPolicy) -> None:
    """After a conversation's first exchange (chat completions, Realtime): its title, written in the
    background by a task the store owns (it awaits it when it closes)."""

    async def run() -> None:
        try:
            title = await generate_title(engine, question, policy)
        except (*BACKEND_ERRORS, ContextOverflow) as exc:
            log.info("no title for %s: %s", conversation_id, exc)
            return
        if title is not None:
            await store.update(owner, conversation_id, title=title)

    store.track(asyncio.create_task(run(), name=f"title {conversation_id}"))
