"""Fuzzing a live Realtime session over a real WebSocket: hypothesis draws every client event type with
plausible and implausible fields, and mutates their JSON (deep nesting, huge numbers, lone surrogates,
cut text, invalid base64, odd sample counts, wrong types); events come in any order. After every event
the session must answer a sentinel, every few batches it must complete a text turn, and no event may
ever cost it a `server_error` or the connection.

``GATEWAY_FUZZ_EVENTS`` sets how many events: 4000 by default (about 6 s here), more for a longer run.
"""

from __future__ import annotations

import base64
import json
import os
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from websockets.sync.client import ClientConnection, connect

from tests.gateway_process import GatewayProcess
from tests.integration.conftest import MODEL

FUZZ_EVENTS = int(os.environ.get("GATEWAY_FUZZ_EVENTS", "4000"))
BATCH = 20
TURN_EVERY = 10  # batches

short_text = st.text(max_size=24)
leaf = st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False) | short_text
json_value = st.recursive(leaf, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(short_text, inner, max_size=3),
                          max_leaves=8)
content_part = st.fixed_dictionaries(
    {"type": st.sampled_from(["input_text", "text", "output_text", "input_audio", "output_audio", "image", 7])},
    optional={"text": short_text | json_value, "transcript": short_text, "audio": short_text})
item = st.fixed_dictionaries(
    {"type": st.sampled_from(["message", "function_call", "function_call_output", "bogus"])},
    optional={"id": short_text, "role": st.sampled_from(["user", "assistant", "system", "tool", 1]),
              "content": st.lists(content_part, max_size=3) | json_value, "call_id": short_text,
              "name": short_text, "arguments": short_text, "output": short_text | json_value,
              "status": st.sampled_from(["completed", "incomplete", "in_progress", "weird"])})
pcm = st.binary(max_size=4801)  # odd lengths: half a 16-bit sample
audio = pcm.map(lambda b: base64.b64encode(b).decode()) | st.sampled_from(["", "!!!", "QUJD=", "A" * 3]) | short_text
turn_detection = st.none() | st.fixed_dictionaries(
    {"type": st.sampled_from(["server_vad", "semantic_vad", "none", 3])},
    optional={"threshold": st.floats(-1, 2), "silence_duration_ms": st.integers(-100, 10**6),
              "prefix_padding_ms": st.integers(-100, 10**6), "create_response": st.booleans(),
              "interrupt_response": st.booleans(), "idle_timeout_ms": st.integers(-5, 10**7) | st.none()})
session = st.fixed_dictionaries({}, optional={
    "instructions": short_text, "output_modalities": st.lists(st.sampled_from(["text", "audio", "video"]), max_size=2),
    "max_output_tokens": st.integers(-10, 10**5) | st.just("inf") | short_text,
    "temperature": st.floats(-1, 3) | short_text,
    "audio": st.fixed_dictionaries({}, optional={
        "input": st.fixed_dictionaries({}, optional={
            "format": st.fixed_dictionaries({"type": st.sampled_from(["audio/pcm", "audio/pcmu", "audio/pcma", "x"])},
                                            optional={"rate": st.integers(-1, 96000)}),
            "turn_detection": turn_detection, "transcription": json_value}),
        "output": json_value}) | json_value,
    "tools": json_value, "tool_choice": json_value, "type": st.sampled_from(["realtime", "transcription", "x"])})
response = st.fixed_dictionaries({}, optional={
    "instructions": short_text, "max_output_tokens": st.integers(-3, 12) | st.just("inf"),
    "output_modalities": st.lists(st.sampled_from(["text", "audio"]), max_size=2),
    "conversation": st.sampled_from(["auto", "none", "other"]), "input": st.lists(item, max_size=2) | json_value,
    "metadata": json_value, "temperature": st.floats(-1, 3)})
event = st.one_of(
    st.builds(lambda s: {"type": "session.update", "session": s}, session | json_value),
    st.builds(lambda a: {"type": "input_audio_buffer.append", "audio": a}, audio),
    st.just({"type": "input_audio_buffer.commit"}),
    st.just({"type": "input_audio_buffer.clear"}),
    st.builds(lambda i, p: {"type": "conversation.item.create", "item": i, "previous_item_id": p}, item, st.none() | short_text),
    st.builds(lambda i: {"type": "conversation.item.retrieve", "item_id": i}, short_text | json_value),
    st.builds(lambda i: {"type": "conversation.item.delete", "item_id": i}, short_text),
    st.builds(lambda i, c, a: {"type": "conversation.item.truncate", "item_id": i, "content_index": c, "audio_end_ms": a},
              short_text, st.integers(-2, 3) | json_value, st.integers(-10, 10**9) | json_value),
    st.builds(lambda r: {"type": "response.create", "response": r}, response),
    st.builds(lambda r: {"type": "response.cancel", **r}, st.fixed_dictionaries({}, optional={"response_id": short_text})),
    st.just({"type": "output_audio_buffer.clear"}),
    st.builds(lambda t, v: {"type": t, "x": v}, short_text, json_value),
).flatmap(lambda e: st.fixed_dictionaries({}, optional={"event_id": short_text}).map(lambda extra: {**e, **extra}))


def _mutate(wire: str, how: str, at: int) -> str:
    at = at % (len(wire) + 1)
    if how == "nest":
        return wire[:at] + "[" * 3000 + "]" * 3000 + wire[at:]
    if how == "huge_number":
        return wire.replace("}", ', "n": ' + "7" * 5000 + "}", 1)
    if how == "surrogate":
        return wire.replace('"', '"\\udc80', 1) if at % 2 else wire[:-1] + ', "s": "\\ud800"}'
    if how == "cut":
        return wire[:at]
    if how == "not_an_object":
        return json.dumps([json.loads(wire)])
    return wire


raw_message = st.builds(lambda e, how, at: _mutate(json.dumps(e), how, at), event,
                        st.sampled_from(["none"] * 6 + ["nest", "huge_number", "surrogate", "cut", "not_an_object"]),
                        st.integers(0, 10**6))


class Session:
    """One Realtime session driven synchronously (hypothesis's examples are synchronous)."""

    def __init__(self, ws: ClientConnection) -> None:
        self.ws = ws
        self.sentinels = 0
        self.server_errors: list[dict[str, Any]] = []
        self.recv_until(lambda e: e["type"] == "session.created")

    def recv_until(self, done, timeout: float = 30.0) -> dict[str, Any]:
        while True:
            event = json.loads(self.ws.recv(timeout=timeout))  # every server event is JSON
            if event["type"] == "error" and event["error"].get("type") == "server_error":
                self.server_errors.append(event)
            if done(event):
                return event

    def sentinel(self) -> None:
        self.sentinels += 1
        tag = f"sentinel-{self.sentinels}"
        self.ws.send(json.dumps({"type": "conversation.item.retrieve", "item_id": "no-such-item", "event_id": tag}))
        self.recv_until(lambda e: e["type"] == "error" and e["error"].get("event_id") == tag)

    def text_turn(self) -> None:
        self.ws.send(json.dumps({"type": "response.cancel"}))
        self.ws.send(json.dumps({"type": "response.create", "response": {
            "conversation": "none", "output_modalities": ["text"], "max_output_tokens": 8,
            "input": [{"type": "message", "role": "user",
                       "content": [{"type": "input_text", "text": "What is the capital of France?"}]}]}}))
        done = self.recv_until(lambda e: e["type"] == "response.done"
                               and e["response"]["status"] in ("completed", "incomplete"), timeout=60)
        assert done["response"]["output"], done


@pytest.fixture(scope="module")
def fuzzed(gateway: GatewayProcess) -> Iterator[Session]:
    with connect(f"{gateway.ws_url}/v1/realtime?model={MODEL}", max_size=None, open_timeout=30) as ws:
        yield Session(ws)


@settings(max_examples=max(1, FUZZ_EVENTS // BATCH), deadline=None, database=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                 HealthCheck.data_too_large])
@given(batch=st.lists(raw_message, min_size=BATCH, max_size=BATCH))
def test_no_event_ends_mutes_or_breaks_the_session(fuzzed: Session, batch: list[str]) -> None:
    for raw in batch:
        fuzzed.ws.send(raw)
        fuzzed.sentinel()  # the session still answers, in order
    if fuzzed.sentinels % (BATCH * TURN_EVERY) == 0:
        fuzzed.text_turn()
    assert not fuzzed.server_errors, fuzzed.server_errors[:3]
