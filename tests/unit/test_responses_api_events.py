"""The Responses API's events as a response's output grows (protocol/response_objects.py): in order, numbered,
each part opened before its deltas and closed before the next part, every event one the openai SDK parses with
nothing it does not declare."""

from __future__ import annotations

import json

from gateway.protocol.response_objects import ResponsesApiEvents, ResponseState, Usage, sse_event
from gateway.protocol.responses import parse_response_request
from tests.integration.sdk_types import assert_valid_response, assert_valid_response_event


def events_of(*steps: str) -> tuple[list[dict[str, object]], ResponseState]:
    request = parse_response_request({"model": "m", "input": "Hi", "metadata": {"a": "b"}, "tools": [
        {"type": "function", "name": "f", "parameters": {"type": "object"}, "strict": True}]})
    state = ResponseState(request, 16, {"a": "b"})
    events = ResponsesApiEvents(state)
    out = events.created()
    for step in steps:
        if step == "call":
            out += events.call("call_1", "f", '{"x": 1}')
        elif step.startswith("refusal:"):
            out += events.refusal(step[len("refusal:"):])
        else:
            out += events.text(step)
    out += events.close_message("completed")
    state.status, state.usage = "completed", Usage(10, 4, 3)
    out += events.finished()
    wire = [json.loads(sse_event(event).split(b"data: ", 1)[1]) for event in out]
    for event in wire:
        assert_valid_response_event(event)
    assert [event["sequence_number"] for event in wire] == list(range(len(wire)))
    return wire, state


def test_text_then_a_refusal_then_a_call() -> None:
    wire, state = events_of("Hel", "lo", "refusal:No.", "call")
    assert [event["type"] for event in wire] == [
        "response.created", "response.in_progress", "response.output_item.added", "response.content_part.added",
        "response.output_text.delta", "response.output_text.delta", "response.output_text.done",
        "response.content_part.done", "response.content_part.added", "response.refusal.delta",
        "response.refusal.done", "response.content_part.done", "response.output_item.done",
        "response.output_item.added", "response.function_call_arguments.delta",
        "response.function_call_arguments.done", "response.output_item.done", "response.completed"]
    final = wire[-1]["response"]
    assert isinstance(final, dict)
    assert_valid_response(final)
    message, call = final["output"]
    assert message["content"] == [{"type": "output_text", "text": "Hello", "annotations": [], "logprobs": []},
                                  {"type": "refusal", "refusal": "No."}]
    assert (call["type"], call["call_id"], call["arguments"]) == ("function_call", "call_1", '{"x": 1}')
    assert final["usage"]["input_tokens_details"] == {"cached_tokens": 4, "cache_write_tokens": 6}
    assert final["metadata"] == {"a": "b"} and state.output[1].status == "completed"


def test_a_call_alone_opens_no_message() -> None:
    wire, _ = events_of("call")
    assert [event["type"] for event in wire][2:] == [
        "response.output_item.added", "response.function_call_arguments.delta",
        "response.function_call_arguments.done", "response.output_item.done", "response.completed"]
