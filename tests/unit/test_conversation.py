"""Conversation items: insertion, lookup errors, and truncation to the audio heard."""

from __future__ import annotations

import pytest

from gateway.protocol.client_events import MessageItem
from gateway.protocol.errors import ApiError
from gateway.realtime.conversation import Conversation, Item, SpokenSegment, heard_text, item_from_param


def user(text: str, item_id: str | None = None) -> Item:
    return item_from_param(MessageItem.model_validate({"id": item_id, "type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}))


def spoken_item() -> Item:
    item = Item(id="a1", type="message", role="assistant", status="completed")
    item.content = [{"type": "output_audio", "transcript": "The capital is Paris. It is big."}]
    item.spoken = [SpokenSegment("The capital is Paris.", 0, 1000), SpokenSegment("It is big.", 1000, 1800)]
    item.audio_ms_sent = 1800
    return item


def test_insert_after_and_at_root() -> None:
    conversation = Conversation(max_items=100, max_bytes=1 << 20)
    conversation.add(user("one", "i1"))
    conversation.add(user("three", "i3"))
    assert conversation.add(user("two", "i2"), previous_item_id="i1") == "i1"
    assert conversation.add(user("zero", "i0"), previous_item_id="root") is None
    assert [item.id for item in conversation.items] == ["i0", "i1", "i2", "i3"]


def test_errors_name_the_problem() -> None:
    conversation = Conversation(max_items=100, max_bytes=1 << 20)
    conversation.add(user("one", "i1"))
    with pytest.raises(ApiError) as caught:
        conversation.add(user("again", "i1"))
    assert caught.value.code == "invalid_value"
    with pytest.raises(ApiError) as caught:
        conversation.get("nope")
    assert (caught.value.code, caught.value.status) == ("item_not_found", 404)
    with pytest.raises(ApiError) as caught:
        conversation.add(user("x"), previous_item_id="missing")
    assert caught.value.param == "previous_item_id"
    with pytest.raises(ApiError) as caught:
        user("   ")
    assert caught.value.code == "empty_content"
    assert len(conversation) == 1  # nothing was lost


def test_truncate_cuts_transcript_to_heard_audio() -> None:
    conversation = Conversation(max_items=100, max_bytes=1 << 20)
    conversation.add(spoken_item())
    item = conversation.truncate("a1", 0, 1400)
    assert item.content[0]["transcript"] == "The capital is Paris. It"
    assert item.audio_ms_sent == 1400 and item.status == "incomplete"
    assert [s.text for s in item.spoken] == ["The capital is Paris.", "It is big."]


def test_truncate_past_the_end_of_a_finished_item_is_an_error() -> None:
    conversation = Conversation(max_items=100, max_bytes=1 << 20)
    conversation.add(spoken_item())
    with pytest.raises(ApiError) as caught:
        conversation.truncate("a1", 0, 5000)
    assert caught.value.param == "audio_end_ms"


def test_truncate_of_an_item_still_speaking_clamps_to_audio_sent() -> None:
    conversation = Conversation(max_items=100, max_bytes=1 << 20)
    item = spoken_item()
    item.status = "in_progress"
    conversation.add(item)
    assert conversation.truncate("a1", 0, 99_000).audio_ms_sent == 1800


def test_only_assistant_audio_can_be_truncated() -> None:
    conversation = Conversation(max_items=100, max_bytes=1 << 20)
    conversation.add(user("hello", "u1"))
    with pytest.raises(ApiError):
        conversation.truncate("u1", 0, 0)


def test_heard_text_by_clause() -> None:
    spoken = [SpokenSegment("a b c d", 0, 400), SpokenSegment("e f", 400, 600)]
    assert heard_text(spoken, 0) == ""
    assert heard_text(spoken, 200) == "a b"
    assert heard_text(spoken, 600) == "a b c d e f"


def test_chat_messages_keep_order_and_instructions() -> None:
    conversation = Conversation(max_items=100, max_bytes=1 << 20)
    conversation.add(user("hi", "u1"))
    conversation.add(spoken_item())
    messages = conversation.chat_messages("be brief")
    assert [(m.role, m.content) for m in messages] == [
        ("system", "be brief"),
        ("user", "hi"),
        ("assistant", "The capital is Paris. It is big."),
    ]


def test_items_and_bytes_are_bounded() -> None:
    conversation = Conversation(max_items=3, max_bytes=10)
    conversation.add(user("héllo"))  # 6 bytes of UTF-8
    with pytest.raises(ApiError, match="10-byte bound") as full:
        conversation.add(user("world"))  # 6 + 5 > 10
    assert full.value.code == "conversation_full" and len(conversation) == 1
    conversation.add(user("abc"))
    conversation.add(user("d"))
    with pytest.raises(ApiError, match="maximum of 3 items"):
        conversation.add(user("e"))
    conversation.delete(conversation.items[0].id)  # room again once the client deletes
    conversation.add(user("f"))
    assert len(conversation) == 3
