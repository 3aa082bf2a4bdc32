"""Stored messages as the public Conversations API's items, on a real SQLite database: an assistant message
with text and calls reads as several items, deleting one leaves the others' ids as they were, and a deleted
item's children move up to its parent."""

from __future__ import annotations

from pathlib import Path

from gateway.generation.conversation_items import items_from_rows, public_item, without_item
from gateway.platform.storage.conversations import ConversationStore, NewMessage
from gateway.platform.storage.database import open_database, sqlite_url


def _call(call_id: str) -> dict:
    return {"id": call_id, "type": "function", "function": {"name": "lookup", "arguments": "{}"}}


async def test_deleting_an_item_keeps_the_other_items_ids(tmp_path: Path) -> None:
    store = ConversationStore(await open_database(sqlite_url(tmp_path)))
    try:
        question = NewMessage(role="developer", content=[{"type": "text", "text": "Be brief."}])
        answer = NewMessage(role="assistant", content=[{"type": "text", "text": "Looking."}],
                            tool_calls=[_call("call_a"), _call("call_b"), _call("call_c")], model="m")
        output = NewMessage(role="tool", content=[{"type": "text", "text": "42"}], tool_call_id="call_a")
        conversation = await store.create("key", messages=[question, answer, output])

        before = items_from_rows(await store.branch(conversation))
        ids = [stored.wire["id"] for stored in before]
        assert ids == [question.id, answer.id, f"{answer.id}_0", f"{answer.id}_1", f"{answer.id}_2", output.id]
        assert before[0].wire["role"] == "system", "Realtime has no developer role"
        assert public_item(before[0])["role"] == "developer"
        assert public_item(before[1])["content"] == [{"type": "output_text", "text": "Looking.", "annotations": []}]

        async def delete(item_id: str) -> list[str]:
            current = await store.get("key", conversation.id)
            row = next(row for row in await store.branch(current)
                       if item_id in (stored.wire["id"] for stored in items_from_rows([row])))
            await store.replace_message("key", conversation.id, row.id, without_item(row, item_id))
            return [stored.wire["id"] for stored in items_from_rows(await store.branch(
                await store.get("key", conversation.id)))]

        assert await delete(f"{answer.id}_1") == [i for i in ids if i != f"{answer.id}_1"]
        assert await delete(answer.id) == [question.id, f"{answer.id}_0", f"{answer.id}_2", output.id]
        assert await delete(f"{answer.id}_0") == [question.id, f"{answer.id}_2", output.id]
        assert await delete(question.id) == [f"{answer.id}_2", output.id]
        assert await delete(output.id) == [f"{answer.id}_2"], "the leaf: its parent becomes the leaf"
        rows = await store.all_messages(conversation.id)
        assert [(row.parent_id, row.model, row.tool_calls) for row in rows] == [(None, "m", [_call("call_c")])]
    finally:
        await store.close()
