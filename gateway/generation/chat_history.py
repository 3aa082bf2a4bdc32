"""A chat completion attached to a stored conversation (`conversation` in its body): the prompt is the
conversation's current branch plus the request's messages, and those messages and the reply are stored
under the branch's leaf (the reply becomes the new leaf)."""

from __future__ import annotations

from dataclasses import dataclass

from gateway.platform.storage.conversations import ConversationStore, NewMessage
from gateway.platform.storage.schema import ConversationRow, MessageRow
from gateway.platform.storage.writer import MessageWriter
from inference.llm.chat import ChatMessage


def message_text(row: MessageRow) -> str:
    return "".join(part.get("text") or part.get("transcript") or "" for part in row.content)


def chat_message(row: MessageRow) -> ChatMessage:
    return ChatMessage(row.role, message_text(row), tuple(row.tool_calls or ()), row.tool_call_id)  # type: ignore[arg-type]


def stored_message(message: ChatMessage) -> NewMessage:
    return NewMessage(role=message.role, content=[{"type": "text", "text": message.content}],
                      tool_calls=list(message.tool_calls) or None, tool_call_id=message.tool_call_id)


@dataclass
class AttachedChat:
    store: ConversationStore
    conversation: ConversationRow
    history: list[ChatMessage]

    @classmethod
    async def load(cls, store: ConversationStore, owner: str, conversation_id: str) -> AttachedChat:
        conversation = await store.get(owner, conversation_id)
        return cls(store, conversation, [chat_message(row) for row in await store.branch(conversation)])

    def prompt_messages(self, messages: list[ChatMessage]) -> list[ChatMessage]:
        """System messages first (they are the request's, never stored), then the branch, then the rest."""
        system = [m for m in messages if m.role == "system"]
        return [*system, *self.history, *(m for m in messages if m.role != "system")]

    def writer(self, messages: list[ChatMessage], model: str) -> MessageWriter:
        """Stores the request's messages and the reply to come (in_progress until the writer's finish)."""
        new = [stored_message(m) for m in messages if m.role != "system"]
        reply = NewMessage(role="assistant", content=[], status="in_progress", model=model)
        return MessageWriter(self.store, self.conversation.id, self.conversation.current_leaf_id, new, reply)
