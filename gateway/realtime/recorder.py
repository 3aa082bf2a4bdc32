"""A Realtime session attached to a stored conversation (`?conversation=conv_...`): the stored branch
becomes the session's first items, and the session's items are stored as the client sees them.

The recorder watches the events the session sends, so the stored copy follows exactly what was
announced: a user item at `conversation.item.done` (an audio turn once its transcript is final); a
response's items as soon as `response.output_item.added` announces them, `in_progress`, with the text
written behind as it streams (at most FLUSH_S behind what was sent, so a kill -9 keeps up to there: the
restart marks them `incomplete`), then finished at `response.done` with its status, token counts and
latency marks; and a truncation's heard text at `conversation.item.truncated` (status `truncated`).
One task writes them in order, behind the session: the event loop never waits for the disk. Items are
stored as a chain in the order they were announced; a deletion in the session leaves the stored branch
as it is.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections import deque
from typing import Any, Protocol

from gateway.generation.conversation_items import items_from_rows as stored_items
from gateway.generation.conversation_items import stored_message
from gateway.generation.memory import MEMORY_METADATA
from gateway.generation.runtime import Runtime
from gateway.generation.service import Generator
from gateway.generation.titles import title_later
from gateway.platform.storage.conversations import ConversationStore, MessageStatus
from gateway.platform.storage.schema import ConversationRow, MessageRow
from gateway.protocol.session_config import SessionConfig
from gateway.realtime.conversation import Conversation, Item

log = logging.getLogger(__name__)
FLUSH_S = 0.1  # how far a streamed reply's stored text may lag what was sent (as storage/writer.py's)

_RESPONSE_STATUS: dict[str, MessageStatus] = {"completed": "completed", "cancelled": "cancelled",
                                              "incomplete": "incomplete", "failed": "incomplete"}

def items_from_rows(rows: list[MessageRow]) -> list[tuple[Item, str]]:
    """The stored branch as Realtime items, each with the id of the message it comes from."""
    return [(Item(**stored.wire), stored.message_id) for stored in stored_items(rows)]


def _response_values(response: dict[str, Any]) -> dict[str, Any]:
    """The token counts, latency marks and memories response.done carries, as a stored message's columns."""
    usage = response.get("usage") or {}
    values: dict[str, Any] = {"input_tokens": usage.get("input_tokens"), "output_tokens": usage.get("output_tokens"),
                              "cached_tokens": (usage.get("input_token_details") or {}).get("cached_tokens")}
    metadata = response.get("metadata") or {}
    if marks := metadata.get("gateway_latency"):
        values["latency"] = json.loads(marks)
    if memories := {key: value for key, value in metadata.items() if key in MEMORY_METADATA}:
        values["message_metadata"] = memories
    return values


class ConversationRecorder:
    def __init__(self, store: ConversationStore, conversation: ConversationRow, loaded: list[tuple[Item, str]],
                 model: str, generator: Generator | None) -> None:
        self.store = store
        self.conversation_id = conversation.id
        self.owner = conversation.owner
        self._generator = generator  # writes the title (None: no model, no title)
        self._title_wanted = conversation.title is None and not loaded  # after the first exchange
        self.model = model
        self._leaf = conversation.current_leaf_id
        self._message_ids = {item.id: message_id for item, message_id in loaded}  # session item -> stored message
        self._truncated: set[str] = set()  # cut before their response was done
        self._open: set[str] = set()  # response items stored in_progress, finished at their response.done
        self._streaming: dict[str, Item] = {}  # of those, the messages whose text is written behind
        self._written: dict[str, list[dict[str, Any]]] = {}  # the content last written of each
        self._ops: deque[tuple[str, Any] | None] = deque()  # None: the session ended
        self._wake = asyncio.Event()
        self._task = asyncio.create_task(self._write(), name=f"record {conversation.id}")
        store.track(self._task)

    def observe(self, event: dict[str, Any], conversation: Conversation) -> None:
        """Called with every event the session sends, and the session's conversation as it is now. Cheap:
        a text delta writes nothing here (the writer reads the item's text every FLUSH_S)."""
        kind = event["type"]
        if kind == "response.output_item.added":
            item = _find(conversation, event["item"]["id"])  # absent: a response outside the conversation
            if item is not None and item.id not in self._message_ids:
                self._append(item.to_wire(), "in_progress")
                self._open.add(item.id)
                if item.type == "message":
                    self._streaming[item.id] = item
        elif kind == "conversation.item.done":
            item = event["item"]
            if item["id"] not in self._message_ids:  # a response's items were stored when they started
                self._append(item, "completed")
        elif kind == "response.done":
            status = _RESPONSE_STATUS.get(event["response"]["status"], "incomplete")
            self._title_after(status, conversation)
            for output in event["response"].get("output", []):
                if output["id"] not in self._open:
                    continue
                self._open.discard(output["id"])
                self._streaming.pop(output["id"], None)
                self._written.pop(output["id"], None)
                final = stored_message(output, "truncated" if output["id"] in self._truncated else status)
                values = {"content": final.content, "status": final.status, **_response_values(event["response"])}
                self._put(("save", (self._message_ids[output["id"]], values)))
        elif kind == "conversation.item.truncated":
            self._truncated.add(event["item_id"])
            message_id = self._message_ids.get(event["item_id"])
            if message_id is not None:
                content = stored_message(conversation.get(event["item_id"]).to_wire(), "truncated").content
                self._put(("save", (message_id, {"content": content, "status": "truncated"})))

    def _title_after(self, status: MessageStatus, conversation: Conversation) -> None:
        if not self._title_wanted or status not in ("completed", "incomplete") or self._generator is None:
            return
        question = next((item.text() for item in conversation.items if item.role == "user" and item.text()), None)
        if question:
            self._title_wanted = False
            title_later(self.store, self._generator, self.owner, self.conversation_id, question)

    def _append(self, item: dict[str, Any], status: MessageStatus) -> None:
        message = stored_message(item, status)
        if message.role == "assistant":
            message.model = self.model
        self._message_ids[item["id"]] = message.id
        self._put(("append", message))

    def _put(self, op: tuple[str, Any] | None) -> None:
        self._ops.append(op)
        self._wake.set()

    async def _write(self) -> None:
        while True:
            if not self._ops:
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), FLUSH_S if self._streaming else None)
            if not self._ops:
                await self._write_streamed()
                continue
            op = self._ops.popleft()
            if op is None:
                return
            kind, value = op
            try:
                if kind == "append":
                    await self.store.append(self.conversation_id, self._leaf, [value])
                    self._leaf = value.id
                else:
                    message_id, values = value
                    await self.store.save_message(message_id, **values)
            except Exception:
                log.exception("storing a Realtime item of %s failed", self.conversation_id)

    async def _write_streamed(self) -> None:
        """The text streamed so far of the replies under way (their rows exist: appends are written first)."""
        for item_id, item in list(self._streaming.items()):
            if item_id not in self._streaming:  # finished meanwhile: its final save is queued
                continue
            content = stored_message(item.to_wire(), "in_progress").content
            if content == self._written.get(item_id):
                continue
            self._written[item_id] = content
            try:
                await self.store.save_message(self._message_ids[item_id], content=content)
            except Exception:
                log.exception("storing a Realtime reply of %s failed", self.conversation_id)

    async def close(self, timeout_s: float = 5.0) -> None:
        """The session ended: what it announced is written (bounded by `timeout_s`), then the task ends."""
        self._put(None)
        await asyncio.wait({self._task}, timeout=timeout_s)


class StoredSession(Protocol):
    """What storing a session needs of it (session.py's RealtimeSession)."""

    runtime: Runtime
    recorder: ConversationRecorder | None

    @property
    def config(self) -> SessionConfig: ...

    @property
    def conversation(self) -> Conversation: ...

    def attach_stored(self, conversation_id: str, items: list[Item], recorder: ConversationRecorder) -> None: ...


def _find(conversation: Conversation, item_id: str) -> Item | None:
    return next((item for item in conversation.items if item.id == item_id), None)


async def attach_stored_conversation(session: StoredSession, store: ConversationStore, owner: str,
                                     conversation_id: str) -> None:
    """Before the session starts: continue `conversation_id` (404 for another key's, as for a wrong id)."""
    conversation = await store.get(owner, conversation_id)
    loaded = items_from_rows(await store.branch(conversation))
    generator = session.runtime.generator() if session.runtime.engine is not None else None
    recorder = ConversationRecorder(store, conversation, loaded, session.config.model, generator)
    try:
        session.attach_stored(conversation.id, [item for item, _ in loaded], recorder)
    except BaseException:
        await recorder.close()
        raise


async def hand_off_conversation(session: StoredSession, store: ConversationStore, owner: str) -> str:
    """The stored conversation a session goes on from on another replica: its own when it is attached to
    one (its recorder has stored it), else a new one holding its items as they stand."""
    if session.recorder is not None:
        return session.conversation.id
    conversation = await store.create(owner)
    messages = [stored_message(item.to_wire(), "completed") for item in session.conversation.items]
    if messages:
        await store.append(conversation.id, None, messages)
    return conversation.id
