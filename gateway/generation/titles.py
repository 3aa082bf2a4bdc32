"""A conversation's title, written by the model after the first exchange, at background priority (it
never takes the engine from a live reply: LLMBackend.submit(background=True)).

A small model asked for a title answers the question instead, so the title is decoded under a grammar
(llguidance, inference/llm/constraints.py): words of letters and digits in title case, no quotes or
punctuation, and a few examples of topics before the user's message. The grammar allows one word more
than a title may have: a model that takes it was writing a sentence, not a title. Such a title, an empty
one, a backend that takes no grammar (a remote one) or one that fails gives the user's first words instead.
"""

from __future__ import annotations

import asyncio
import logging
import re

from gateway.generation.chat_plan import ReplyForm
from gateway.generation.reply_path import ReplyPath, ReplyRequest
from gateway.generation.service import Generator
from gateway.platform.storage.conversations import ConversationStore
from gateway.protocol.errors import ApiError
from inference.llm.backend import SamplingParams
from inference.llm.chat import ChatMessage

log = logging.getLogger(__name__)

MAX_TITLE_WORDS = 6
MAX_WORD_CHARS = 16  # a word that reaches it was cut (or glued from several): the title is not used
MAX_TITLE_CHARS = 80
TITLE_INSTRUCTIONS = ("You name conversations. For each message, reply with its topic as a title of one to five "
                      "words. Never answer the message.")
EXAMPLES = (
    ("Tell me a fun fact about octopuses.", "Octopus Fun Fact"),
    ("hello there, how are you today?", "Greeting"),
    ("What is the largest ocean on Earth?", "Largest Ocean On Earth"),
    ("Can you write me a short poem about the sea?", "Poem About The Sea"),
    ("What is the boiling point of water at sea level?", "Boiling Point Of Water"),
    ("Can you help me plan a week-long trip to Japan in spring?", "Spring Trip To Japan"),
    ("my laptop won't turn on after the update, what do i do", "Laptop Will Not Start"),
)
_WORD = rf"[\p{{Lu}}\p{{N}}][\p{{Ll}}\p{{N}}]{{0,{MAX_WORD_CHARS - 1}}}"
TITLE_GRAMMAR = f"start: /{_WORD}( {_WORD}){{0,{MAX_TITLE_WORDS}}}/"


def first_words(question: str) -> str | None:
    """The user's first words as a title: at most MAX_TITLE_WORDS, up to the first sentence's end, without
    its final punctuation."""
    words = question.split()[:MAX_TITLE_WORDS]
    sentence = re.split(r"(?<=[.!?])\s", " ".join(words), maxsplit=1)[0]
    return sentence.rstrip(".!?:;,-").strip()[:MAX_TITLE_CHARS] or None


def usable(title: str, finish_reason: str) -> bool:
    """The model chose to end it, within MAX_TITLE_WORDS words none of which was cut."""
    words = title.split()
    return (finish_reason == "stop" and 0 < len(words) <= MAX_TITLE_WORDS
            and all(len(word) < MAX_WORD_CHARS for word in words))


def _request(question: str) -> ReplyRequest:
    messages = [ChatMessage("system", TITLE_INSTRUCTIONS)]
    for asked, title in EXAMPLES:
        messages += [ChatMessage("user", asked), ChatMessage("assistant", title)]
    messages.append(ChatMessage("user", question[:2000]))
    return ReplyRequest(messages, ReplyForm([], text_grammar=TITLE_GRAMMAR), SamplingParams(temperature=0.0, max_tokens=24))


async def _model_title(generator: Generator, question: str, conversation_id: str) -> str | None:
    try:  # no memory: a title is the conversation's, not the user's
        path = await ReplyPath.prepare(generator, _request(question))
        reply = await path.start(routing_key=conversation_id, background=True)
        try:
            result = await reply.result()
        finally:
            await reply.close()
    except ApiError as exc:
        if exc.code != "unsupported_by_backend":  # a remote backend: no grammar, and unconstrained it writes sentences
            log.info("the model wrote no title for %s: %s", conversation_id, exc)
        return None
    return result.text.strip() if usable(result.text, result.finish_reason) else None


async def generate_title(generator: Generator, question: str, conversation_id: str) -> str | None:
    """The title, through the safety policy as any output of the model: redacted, or none when a rule blocks it."""
    title = await _model_title(generator, question, conversation_id) or first_words(question)
    policy = generator.safety
    screened = policy.screen(title) if title is not None and policy else None
    if screened is None:
        return title
    return None if screened.blocked is not None else first_words(screened.text)


def title_later(store: ConversationStore, generator: Generator, owner: str, conversation_id: str,
                question: str) -> None:
    """After a conversation's first exchange (chat completions, Realtime): its title, written in the
    background by a task the store owns (it awaits it when it closes)."""

    async def run() -> None:
        title = await generate_title(generator, question, conversation_id)
        if title is not None:
            await store.update(owner, conversation_id, title=title)

    store.track(asyncio.create_task(run(), name=f"title {conversation_id}"))
