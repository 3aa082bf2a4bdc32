"""Memory, opt-in per API key: facts the user asks the assistant to remember, kept in the database and put into
the context of later conversations when they bear on what is asked.

Off by default: a key turns it on (POST /v1/memories/settings); while it is off nothing is stored or read. Two
ways in, both as the policy leaves the text (personal data redacted):
- a user message that asks to remember something ("Remember that my dog is called Rex.") stores that fact;
- the model is offered a built-in `remember` tool and may save a fact itself; the gateway runs the call out of
  the client's sight and the reply goes on in a second round that knows it was saved (memory_tool.py).
Each answer lists the memories it was given and those it saved (memories_used, memories_saved): a chat
completion's metadata, a Realtime response's, a stored message's. GET / DELETE /v1/memories show and erase them
(transports/memories_http.py).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from gateway.platform.storage.memories import MAX_MEMORY_CHARS, MemoryStore
from gateway.platform.storage.schema import MemoryRow
from gateway.protocol.chat import MEMORY_TOOL_NAME
from gateway.protocol.errors import ApiError
from gateway.safety.policy import SafetyPolicy
from inference.llm.chat import ChatMessage
from inference.llm.tool_calls import ToolCall, ToolSpec

RELEVANT = 3  # most memories one answer is given
MEMORY_METADATA = ("memories_used", "memories_saved")  # the metadata keys of an answer
_REMEMBER = re.compile(
    r"^\s*(?:please\s+)?(?:remember|don'?t\s+forget|do\s+not\s+forget|note)(?:\s+that)?\s*[:,]?\s+(?P<fact>\S.*?)"
    r"\s*[.!]?\s*$", re.IGNORECASE | re.DOTALL)
REMEMBER_TOOL = ToolSpec(
    MEMORY_TOOL_NAME,
    "Save a fact about the user for later conversations. Call it when the user asks you to remember something, "
    "or tells you something about themselves that will help you later.",
    {"type": "object", "properties": {"fact": {"type": "string", "description": "The fact, in one short sentence."}},
     "required": ["fact"], "additionalProperties": False},
)
_WORD = re.compile(r"[^\W_]{3,}")
_STOP = frozenset("the and are was were what who whom whose which when where why how you your yours for with that this "
                  "these those have has had not but can could would should will from about into than then them they "
                  "their there here its it's our ours his her hers him she was does did done please tell know remember "
                  "like just also any all some one".split())


def fact_to_remember(text: str) -> str | None:
    """The fact a message asks to be remembered ("Remember that X." -> "X"), or None."""
    match = _REMEMBER.match(text)
    if match is None:
        return None
    fact = match.group("fact").strip()
    return fact[:MAX_MEMORY_CHARS] if fact else None


def _words(text: str) -> set[str]:
    return {word for word in (w.lower() for w in _WORD.findall(text)) if word not in _STOP}


def relevant(memories: Sequence[MemoryRow], text: str, limit: int = RELEVANT) -> list[MemoryRow]:
    """The memories that share the most words with `text` (none that share none), newest first among equals."""
    words = _words(text)
    scored = [(len(words & _words(memory.content)), memory.id, memory) for memory in memories]
    ranked = sorted((entry for entry in scored if entry[0] > 0), key=lambda entry: (entry[0], entry[1]), reverse=True)
    return [memory for _, _, memory in ranked[:limit]]


def memory_off() -> ApiError:
    return ApiError("invalid_value", f"tool_choice names '{REMEMBER_TOOL.name}', the built-in memory tool, but memory "
                    "is off for this API key (POST /v1/memories/settings turns it on).", "tool_choice")


@dataclass
class Recall:
    """What memory did for one answer: the memories it was given, and those it saved (its question's fact,
    and the model's `remember` calls, which `save_calls` runs)."""

    used: list[MemoryRow] = field(default_factory=list)
    saved: list[MemoryRow] = field(default_factory=list)
    store: MemoryStore | None = None
    owner: str = ""

    async def save_calls(self, calls: Sequence[ToolCall], policy: SafetyPolicy) -> list[ChatMessage]:
        """Runs the model's `remember` calls (each fact stored as the policy leaves it; one it refuses is not) and
        returns what the model's next round reads: its calls, and each call's result."""
        assert self.store is not None
        results = []
        for call in calls:
            fact = json.loads(call.arguments).get("fact")
            screened = policy.screen(fact.strip()) if isinstance(fact, str) and policy else None
            if not isinstance(fact, str) or not fact.strip():
                outcome = "Not saved: the fact was empty."
            elif screened is not None and screened.blocked is not None:
                outcome = "Not saved: the content policy refused it."
            else:
                self.saved.append(await self.store.add(self.owner, screened.text if screened else fact.strip()))
                outcome = "Saved."
            results.append(ChatMessage("tool", outcome, tool_call_id=call.id))
        return [ChatMessage("assistant", "", tool_calls=tuple(call.openai() for call in calls)), *results]

    @property
    def instructions(self) -> str | None:
        if not self.used:
            return None
        facts = "\n".join(f"- {memory.content}" for memory in self.used)
        # Worded for small models: told "You remember ...", SmolLM2-135M took "my dog" for its own and denied having one.
        return f"Facts the user asked you to remember (in the user's words, 'my' means the user's):\n{facts}"

    def messages(self) -> list[ChatMessage]:
        """The instructions as the prompt's last system message: after the tools' instructions, which are the same
        for every request and so stay in the prefix cache, while the facts change with the question."""
        return [ChatMessage("system", self.instructions)] if self.instructions else []

    def metadata(self) -> dict[str, str]:
        """Strings to strings, as OpenAI's metadata: ids, comma-separated."""
        used, saved = MEMORY_METADATA
        return {used: ",".join(m.id for m in self.used), saved: ",".join(m.id for m in self.saved)}


async def recall(store: MemoryStore | None, owner: str, messages: Sequence[ChatMessage], *,
                 save: bool = True) -> Recall | None:
    """None unless the key turned memory on. Otherwise the last user message (already through the safety policy)
    is saved when it asks to be remembered (unless `save` is False: a draft, a regenerated reply), and the
    memories that bear on it are picked."""
    if store is None or not await store.enabled(owner):
        return None
    question = next((m.content for m in reversed(messages) if m.role == "user"), "")
    result = Recall(store=store, owner=owner)
    fact = fact_to_remember(question) if save else None
    if fact is not None:
        result.saved.append(await store.add(owner, fact))
    saved = {m.id for m in result.saved}
    result.used = relevant([m for m in await store.list(owner) if m.id not in saved], question)
    return result


@dataclass
class MemoryAccount:
    """One key's memory, as a Realtime session draws on it (recalled for each response, as for a chat)."""

    store: MemoryStore
    owner: str

    async def recall(self, messages: Sequence[ChatMessage], *, save: bool = True) -> Recall | None:
        return await recall(self.store, self.owner, messages, save=save)
