"""A streamed reply, written behind the stream: the token path only appends to memory, and a task owned
by the store inserts the turn's messages, writes the text as it grows, then the message's end. A slow
disk delays the stored copy, never a token."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from gateway.platform.storage.conversations import ConversationStore, MessageStatus, NewMessage

log = logging.getLogger(__name__)
FLUSH_S = 0.1  # how far the stored text may lag what was streamed (a crash keeps up to here)


class MessageWriter:
    def __init__(self, store: ConversationStore, conversation_id: str, parent_id: str | None,
                 messages: list[NewMessage], reply: NewMessage) -> None:
        self.store = store
        self.reply = reply
        self._text: list[str] = []
        self._written = 0
        self._end: dict[str, Any] | None = None
        self._ended = asyncio.Event()
        self._task = asyncio.create_task(self._run(conversation_id, parent_id, [*messages, reply]),
                                         name=f"write {reply.id}")
        store.track(self._task)

    def append(self, delta: str) -> None:
        self._text.append(delta)

    def finish(self, status: MessageStatus, *, text: str | None = None, **values: Any) -> None:
        """The reply's end (status, token counts, latency, error, tool calls); `text` replaces the streamed
        text (a reply whose calls were parsed out of it)."""
        if self._end is None:
            if text is not None:
                self._text = [text]
            self._end = {"status": status, **values}
            self._ended.set()

    async def written(self, timeout_s: float = 5.0) -> None:
        """Wait (bounded: a stuck disk must not hold the answer forever) until the end is stored, so that a
        client reading the conversation after the answer finds it."""
        await asyncio.wait({self._task}, timeout=timeout_s)

    def _content(self) -> list[dict[str, Any]]:
        return [{"type": "text", "text": "".join(self._text)}]

    async def _run(self, conversation_id: str, parent_id: str | None, messages: list[NewMessage]) -> None:
        try:
            await self.store.append(conversation_id, parent_id, messages)
            while self._end is None:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._ended.wait(), FLUSH_S)
                if self._end is None and len(self._text) != self._written:
                    self._written = len(self._text)
                    await self.store.save_message(self.reply.id, content=self._content())
            await self.store.save_message(self.reply.id, content=self._content(), **self._end)
        except Exception:
            log.exception("storing message %s failed", self.reply.id)
