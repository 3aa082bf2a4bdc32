"""The response event sequence: well-formed in order, and closed properly whenever it ends."""

from __future__ import annotations

import pytest

from gateway.realtime.conversation import Item
from gateway.realtime.response_events import ResponseEvents, TokenUsage


def make(audio: bool = False, in_conversation: bool = True) -> ResponseEvents:
    item = Item(id="item_a", type="message", role="assistant", status="in_progress")
    return ResponseEvents(
        response_id="resp_1",
        conversation_id="conv_1" if in_conversation else None,
        item=item,
        audio=audio,
        audio_format={"type": "audio/pcm", "rate": 24000},
        voice="joe",
        max_output_tokens=100,
    )


def types(events: list[dict]) -> list[str]:
    return [event["type"] for event in events]


def test_text_response_sequence() -> None:
    response = make()
    events = response.created() + response.open_item(previous_item_id="item_user")
    events += response.text_delta("Par") + response.text_delta("is.")
    events += response.finish("completed", usage=TokenUsage(10, 4, 3))
    assert types(events) == [
        "response.created",
        "response.output_item.added",
        "conversation.item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "conversation.item.done",
        "response.done",
    ]
    assert events[2]["previous_item_id"] == "item_user"
    assert events[6]["text"] == "Paris."
    done = events[-1]["response"]
    assert done["status"] == "completed" and done["status_details"] is None
    assert done["usage"]["input_tokens"] == 10 and done["usage"]["output_tokens"] == 3
    assert done["usage"]["input_token_details"]["cached_tokens"] == 4
    assert done["output"][0]["status"] == "completed"
    assert done["output"][0]["content"] == [{"type": "output_text", "text": "Paris."}]


def test_audio_response_uses_transcript_and_audio_events() -> None:
    response = make(audio=True)
    events = response.created() + response.open_item(None) + response.text_delta("Hi")
    events += response.audio_delta("AAAA") + response.finish("completed")
    assert types(events)[4:8] == [
        "response.output_audio_transcript.delta",
        "response.output_audio.delta",
        "response.output_audio.done",
        "response.output_audio_transcript.done",
    ]
    assert events[-1]["response"]["output"][0]["content"][0] == {"type": "output_audio", "transcript": "Hi"}


@pytest.mark.parametrize("opened", [False, True])
def test_cancel_at_any_point_ends_with_cancelled_done(opened: bool) -> None:
    response = make()
    events = response.created()
    if opened:
        events += response.open_item(None) + response.text_delta("Half a sent")
    tail = response.finish("cancelled", reason="client_cancelled")
    assert tail[-1]["type"] == "response.done"
    done = tail[-1]["response"]
    assert done["status"] == "cancelled"
    assert done["status_details"] == {"type": "cancelled", "reason": "client_cancelled"}
    if opened:
        # The partial text stays, marked incomplete.
        assert done["output"][0]["status"] == "incomplete"
        assert done["output"][0]["content"][0]["text"] == "Half a sent"
        assert "response.output_item.done" in types(tail)
    else:
        assert types(tail) == ["response.done"] and done["output"] == []


def test_finish_is_idempotent() -> None:
    response = make()
    response.created()
    assert response.finish("completed")
    assert response.finish("cancelled", reason="client_cancelled") == []
    assert response.status == "completed"


def test_truncated_text_replaces_the_streamed_one() -> None:
    response = make(audio=True)
    response.open_item(None)
    response.text_delta("One two three four.")
    tail = response.finish("cancelled", reason="turn_detected", final_text="One two")
    assert tail[1]["transcript"] == "One two"


def test_out_of_band_response_does_not_touch_the_conversation() -> None:
    response = make(in_conversation=False)
    events = response.created() + response.open_item(None) + response.finish("completed")
    assert not any(t.startswith("conversation.") for t in types(events))
