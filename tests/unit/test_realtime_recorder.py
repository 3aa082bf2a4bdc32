"""The recorder that stores a Realtime session's items, on a real SQLite database, fed the events a
session sends: a reply stored in_progress when it starts and its text written behind as it streams,
statuses from response.done, a truncation before and after the reply is done, calls, and the stored
branch read back as items."""

from __future__ import annotations

import asyncio
from pathlib import Path

from gateway.platform.storage.conversations import ConversationStore
from gateway.platform.storage.database import open_database, sqlite_url
from gateway.realtime.conversation import Conversation, Item
from gateway.realtime.recorder import FLUSH_S, ConversationRecorder, items_from_rows


def _added(item: Item) -> dict:
    return {"type": "response.output_item.added", "item": item.to_wire()}


def _response_done(status: str, *items: Item) -> dict:
    return {"type": "response.done", "response": {
        "status": status, "output": [item.to_wire() for item in items],
        "usage": {"input_tokens": 40, "output_tokens": 7, "input_token_details": {"cached_tokens": 32}},
        "metadata": {"gateway_latency": '{"first_token_ms":21.5,"done_ms":90.0}'}}}


async def test_items_are_stored_as_announced_and_read_back(tmp_path: Path) -> None:
    store = ConversationStore(await open_database(sqlite_url(tmp_path)))
    row = await store.create("key")
    recorder = ConversationRecorder(store, row, [], "smollm2", None)
    session = Conversation(max_items=100, max_bytes=1 << 20, conversation_id=row.id)

    def add(item: Item) -> Item:
        session.add(item)
        return item

    question = add(Item(id="item_q", type="message", role="user", content=[{"type": "input_audio", "transcript": "Hi"}]))
    recorder.observe({"type": "conversation.item.done", "item": question.to_wire()}, session)
    answer = add(Item(id="item_a", type="message", role="assistant", status="in_progress",
                      content=[{"type": "output_audio", "transcript": ""}]))
    recorder.observe(_added(answer), session)
    answer.content[0]["transcript"] = "Hello"  # barge-in: cut to what was heard before the response is done
    recorder.observe({"type": "conversation.item.truncated", "item_id": "item_a"}, session)
    recorder.observe(_response_done("cancelled", answer), session)
    call = add(Item(id="item_c", type="function_call", call_id="call_1", name="weather", arguments='{"city":"Oslo"}'))
    recorder.observe(_added(call), session)
    recorder.observe(_response_done("completed", call), session)
    output = add(Item(id="item_o", type="function_call_output", call_id="call_1", output="sunny"))
    recorder.observe({"type": "conversation.item.done", "item": output.to_wire()}, session)
    outside = Item(id="item_x", type="message", role="assistant", content=[{"type": "output_text", "text": "aside"}])
    recorder.observe(_response_done("completed", outside), session)  # conversation "none": not stored
    await recorder.close()

    row = await store.get("key", row.id)
    branch = await store.branch(row)
    assert [(m.role, m.status) for m in branch] == [("user", "completed"), ("assistant", "truncated"),
                                                    ("assistant", "completed"), ("tool", "completed")]
    assert branch[0].content == [{"type": "input_audio", "transcript": "Hi"}]
    assert branch[1].content == [{"type": "output_audio", "transcript": "Hello"}] and branch[1].model == "smollm2"
    assert (branch[1].input_tokens, branch[1].cached_tokens, branch[1].output_tokens) == (40, 32, 7)
    assert branch[1].latency == {"first_token_ms": 21.5, "done_ms": 90.0}
    assert branch[2].tool_calls == [{"id": "call_1", "type": "function",
                                     "function": {"name": "weather", "arguments": '{"city":"Oslo"}'}}]
    assert branch[3].tool_call_id == "call_1" and row.current_leaf_id == branch[3].id

    items = items_from_rows(branch)
    assert [(item.type, item.role, item.status) for item, _ in items] == [
        ("message", "user", "completed"), ("message", "assistant", "completed"), ("function_call", None, "completed"),
        ("function_call_output", None, "completed")]
    assert items[1][0].content == [{"type": "output_audio", "transcript": "Hello"}]

    # A truncation after the reply was stored rewrites the stored copy.
    recorder = ConversationRecorder(store, row, items, "smollm2", None)
    session = Conversation(max_items=100, max_bytes=1 << 20, conversation_id=row.id)
    for item, _ in items:
        session.add(item)
    session.get(branch[1].id).content[0]["transcript"] = "Hel"
    recorder.observe({"type": "conversation.item.truncated", "item_id": branch[1].id}, session)
    await recorder.close()
    stored = (await store.branch(await store.get("key", row.id)))[1]
    assert stored.content == [{"type": "output_audio", "transcript": "Hel"}] and stored.status == "truncated"
    await store.close()


async def test_a_reply_is_stored_in_progress_and_its_text_written_behind(tmp_path: Path) -> None:
    store = ConversationStore(await open_database(sqlite_url(tmp_path)))
    row = await store.create("key")
    recorder = ConversationRecorder(store, row, [], "smollm2", None)
    session = Conversation(max_items=100, max_bytes=1 << 20, conversation_id=row.id)
    reply = Item(id="item_r", type="message", role="assistant", status="in_progress",
                 content=[{"type": "output_text", "text": ""}])
    session.add(reply)

    async def stored() -> tuple[str, list[dict]]:
        [message] = await store.all_messages(row.id)
        return message.status, message.content

    recorder.observe(_added(reply), session)
    await asyncio.sleep(FLUSH_S * 3)
    assert await stored() == ("in_progress", [{"type": "text", "text": ""}]), "stored when it starts"
    for word in ("Once", " upon", " a"):  # the session updates the item's text with each delta
        reply.content[0]["text"] += word
        recorder.observe({"type": "response.output_text.delta", "item_id": reply.id, "delta": word}, session)
    await asyncio.sleep(FLUSH_S * 3)
    assert await stored() == ("in_progress", [{"type": "text", "text": "Once upon a"}]), "written behind"
    reply.content[0]["text"] += " time."
    recorder.observe(_response_done("completed", reply), session)
    await recorder.close()
    assert await stored() == ("completed", [{"type": "text", "text": "Once upon a time."}])
    [message] = await store.all_messages(row.id)
    assert message.output_tokens == 7 and message.model == "smollm2"
    assert (await store.get("key", row.id)).current_leaf_id == message.id
    await store.close()
