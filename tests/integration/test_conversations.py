"""Stored conversations against the real gateway and a real SQLite file: the public Conversations API with the
openai SDK (items, pages, metadata, errors, the same conversation read as a tree), the ChatGPT-style REST API,
its pagination and ownership, chat completions attached to a conversation (history, branches), the seeds' streaming API
(delta encoding, titles, regenerate and edit, resume), pre-warm, and SIGKILL mid-stream."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from openai.types.conversations import (
    Conversation,
    ConversationDeletedResource,
    ConversationItem,
    ConversationItemList,
)

from gateway.generation.prewarm import PINNED_PER_KEY
from tests.gateway_process import GatewayProcess, start_gateway
from tests.integration.conftest import MODEL
from tests.integration.realtime_client import RealtimeClient
from tests.integration.sdk_types import assert_valid_conversations_object

KEY_A = "sk-conversations-key-a"
KEY_B = "sk-conversations-key-b"


def start(tmp: Path) -> GatewayProcess:
    return start_gateway("--api-keys", f"{KEY_A},{KEY_B}", "--no-load-voice-models", "--data-dir", str(tmp / "data"),
                         log_path=tmp / f"gateway-{time.monotonic_ns()}.log")


@pytest.fixture(scope="module")
def stored(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[GatewayProcess, Path]]:
    tmp = tmp_path_factory.mktemp("conversations")
    process = start(tmp)
    yield process, tmp
    process.stop()


def client(gateway: GatewayProcess, key: str = KEY_A) -> httpx.Client:
    return httpx.Client(base_url=gateway.url, headers={"authorization": f"Bearer {key}"}, timeout=120)


def ask(http: httpx.Client, conversation: str | None, text: str, max_tokens: int = 8) -> dict[str, Any]:
    body: dict[str, Any] = {"model": MODEL, "max_tokens": max_tokens, "temperature": 0,
                            "messages": [{"role": "user", "content": text}]}
    if conversation is not None:
        body["conversation"] = conversation
    response = http.post("/v1/chat/completions", json=body)
    assert response.status_code == 200, response.text
    return response.json()


def assert_error(response: httpx.Response, status: int, code: str) -> None:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["code"] == code and set(error) >= {"message", "type", "param", "code"}


def test_crud_pagination_and_ownership(stored: tuple[GatewayProcess, Path]) -> None:
    gateway, _ = stored
    with client(gateway) as http, client(gateway, KEY_B) as other:
        made = [http.post("/backend-api/conversations", json={"title": f"chat {i}"}).json() for i in range(5)]
        assert all(c["object"] == "conversation" and c["id"].startswith("conv_") for c in made)
        assert other.get("/backend-api/conversations").json()["data"] == []  # another key sees none of them

        seen: list[str] = []
        after = None
        while True:
            page = http.get("/backend-api/conversations", params={"limit": 2, **({"after": after} if after else {})}).json()
            seen += [c["id"] for c in page["data"]]
            assert len(page["data"]) <= 2 and page["last_id"] == page["data"][-1]["id"]
            if not page["has_more"]:
                break
            after = page["last_id"]
        assert seen == [c["id"] for c in reversed(made)]  # newest first, each once
        oldest_first = http.get("/backend-api/conversations", params={"order": "asc", "limit": 100}).json()["data"]
        assert [c["id"] for c in oldest_first] == [c["id"] for c in made]

        target = made[0]["id"]
        renamed = http.patch(f"/backend-api/conversation/{target}", json={"title": "renamed"})
        assert renamed.status_code == 200 and renamed.json()["title"] == "renamed"
        for response in (other.get(f"/backend-api/conversation/{target}"), other.delete(f"/backend-api/conversation/{target}"),
                         other.patch(f"/backend-api/conversation/{target}", json={"title": "mine"}),
                         other.get(f"/backend-api/conversation/{target}/messages"),
                         other.post("/v1/chat/completions", json={"model": MODEL, "conversation": target,
                                                                  "messages": [{"role": "user", "content": "hi"}]})):
            assert_error(response, 404, "conversation_not_found")  # 404, not 403: its existence is not told
        assert_error(http.get("/backend-api/conversation/conv_nope"), 404, "conversation_not_found")
        assert_error(http.patch(f"/backend-api/conversation/{target}", json={}), 400, "invalid_value")
        assert http.patch(f"/backend-api/conversation/{target}", json={"colour": "red"}).status_code == 400
        assert_error(http.get("/backend-api/conversations", params={"limit": 0}), 422, "invalid_value")
        assert_error(http.get("/backend-api/conversations", params={"order": "sideways"}), 422, "invalid_value")
        assert http.post("/backend-api/conversations", content=b"[1]").status_code == 400
        assert httpx.get(f"{gateway.url}/backend-api/conversations").status_code == 401

        deleted = http.delete(f"/backend-api/conversation/{target}")
        assert deleted.json() == {"id": target, "object": "conversation.deleted", "deleted": True}
        assert_error(http.get(f"/backend-api/conversation/{target}"), 404, "conversation_not_found")
        assert_error(http.delete(f"/backend-api/conversation/{target}"), 404, "conversation_not_found")


def test_chat_completions_continue_a_conversation_and_branch(stored: tuple[GatewayProcess, Path]) -> None:
    gateway, _ = stored
    with client(gateway) as http:
        conversation = http.post("/backend-api/conversations", json={}).json()["id"]
        alone = ask(http, None, "What is two plus two?")
        first = ask(http, conversation, "My name is Ann.")
        second = ask(http, conversation, "What is two plus two?")
        # The second turn's prompt holds the first exchange, and the engine's cache has its prefix.
        assert second["usage"]["prompt_tokens"] > alone["usage"]["prompt_tokens"] + 5
        assert second["usage"]["prompt_tokens_details"]["cached_tokens"] > 0

        view = http.get(f"/backend-api/conversation/{conversation}").json()
        branch = view["messages"]
        assert [m["role"] for m in branch] == ["user", "assistant", "user", "assistant"]
        assert [m["parent_id"] for m in branch] == [None, branch[0]["id"], branch[1]["id"], branch[2]["id"]]
        assert branch[0]["content"] == [{"type": "text", "text": "My name is Ann."}]
        assert branch[1]["content"][0]["text"] == first["choices"][0]["message"]["content"]
        assert branch[3]["content"][0]["text"] == second["choices"][0]["message"]["content"]
        assert branch[3]["status"] in ("completed", "incomplete") and branch[3]["usage"]["output_tokens"] >= 1
        assert branch[3]["model"] == MODEL and branch[3]["latency"]["ttft_ms"] > 0
        assert view["current_leaf_id"] == branch[3]["id"]

        # Edit the second question: a sibling branch under the first answer.
        assert http.patch(f"/backend-api/conversation/{conversation}", json={"current_leaf_id": branch[1]["id"]}).status_code == 200
        ask(http, conversation, "What is three plus three?")
        current = http.get(f"/backend-api/conversation/{conversation}").json()["messages"]
        assert [m["id"] for m in current[:2]] == [m["id"] for m in branch[:2]]
        assert current[2]["content"][0]["text"] == "What is three plus three?" and current[2]["parent_id"] == branch[1]["id"]
        everything = http.get(f"/backend-api/conversation/{conversation}", params={"all_branches": "true"}).json()["messages"]
        assert len(everything) == 6 and sum(1 for m in everything if m["parent_id"] == branch[1]["id"]) == 2

        pages: list[dict[str, Any]] = []
        after = None
        while True:
            page = http.get(f"/backend-api/conversation/{conversation}/messages",
                            params={"limit": 4, **({"after": after} if after else {})}).json()
            pages += page["data"]
            if not page["has_more"]:
                break
            after = page["last_id"]
        assert [m["id"] for m in pages] == [m["id"] for m in everything]  # oldest first, each once

        other = http.post("/backend-api/conversations", json={}).json()["id"]
        assert_error(http.patch(f"/backend-api/conversation/{other}", json={"current_leaf_id": branch[1]["id"]}),
                     404, "message_not_found")


def sdk(gateway: GatewayProcess, key: str = KEY_A) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{gateway.url}/v1", api_key=key, max_retries=0, timeout=120)


def checked(model: Any, response: Any) -> Any:
    """A `with_raw_response` call's body, validated against the SDK's `model`, then parsed by the SDK."""
    assert_valid_conversations_object(model, response.http_response.json())
    return response.parse()


SEED_ITEMS: list[Any] = [
    {"type": "message", "role": "developer", "content": "Answer in one sentence."},
    {"role": "user", "content": "My name is Ann."},  # an "easy" message: no type
    {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Hello Ann.", "annotations": []}]},
    {"type": "function_call", "call_id": "call_1", "name": "lookup", "arguments": '{"q": "Ann"}'},
    {"type": "function_call_output", "call_id": "call_1", "output": "42"},
]


def test_the_public_conversations_api_with_the_sdk(stored: tuple[GatewayProcess, Path]) -> None:
    gateway, _ = stored
    with sdk(gateway) as api, sdk(gateway, KEY_B) as other, client(gateway) as http:
        made = checked(Conversation, api.conversations.with_raw_response.create(items=SEED_ITEMS,
                                                                               metadata={"topic": "names"}))
        assert made.id.startswith("conv_") and made.metadata == {"topic": "names"}
        assert checked(Conversation, api.conversations.with_raw_response.retrieve(made.id)).id == made.id
        updated = checked(Conversation, api.conversations.with_raw_response.update(made.id, metadata={"topic": "x"}))
        assert updated.metadata == {"topic": "x"} and api.conversations.retrieve(made.id).metadata == {"topic": "x"}

        # Pages of two, oldest first, each page's last_id the next one's `after`.
        pages: list[list[str]] = []
        after: Any = openai.omit
        while True:
            page = checked(ConversationItemList, api.conversations.items.with_raw_response.list(
                made.id, limit=2, order="asc", after=after))
            pages.append([item.id for item in page.data])
            if not page.has_more:
                break
            after = page.last_id
        ids = [item_id for page_ids in pages for item_id in page_ids]
        assert [len(page_ids) for page_ids in pages] == [2, 2, 1] and len(set(ids)) == 5
        assert [item.id for item in api.conversations.items.list(made.id, limit=2, order="asc")] == ids  # SDK pages
        newest_first = api.conversations.items.list(made.id).data  # desc by default, as OpenAI
        assert [item.id for item in newest_first] == ids[::-1]
        items = [checked(ConversationItem, api.conversations.items.with_raw_response.retrieve(item_id,
                                                                                               conversation_id=made.id))
                 for item_id in ids]
        assert [item.type for item in items] == ["message", "message", "message", "function_call",
                                                  "function_call_output"]
        assert [item.role for item in items[:3]] == ["developer", "user", "assistant"]
        assert items[1].content[0].type == "input_text" and items[1].content[0].text == "My name is Ann."
        assert items[2].content[0].type == "output_text" and items[2].content[0].text == "Hello Ann."
        assert (items[3].call_id, items[3].name, items[3].arguments) == ("call_1", "lookup", '{"q": "Ann"}')
        assert (items[4].call_id, items[4].output) == ("call_1", "42")

        added = checked(ConversationItemList, api.conversations.items.with_raw_response.create(
            made.id, items=[{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hi"}]}]))
        assert len(added.data) == 1 and added.first_id == added.last_id == added.data[0].id
        ids.append(added.data[0].id)

        # The same conversation as a tree: its current branch, one message per item here, chained.
        tree = http.get(f"/backend-api/conversation/{made.id}").json()
        assert [m["id"] for m in tree["messages"]] == ids and tree["current_leaf_id"] == ids[-1]
        assert [m["parent_id"] for m in tree["messages"]] == [None, *ids[:-1]]
        assert [m["role"] for m in tree["messages"]] == ["developer", "user", "assistant", "assistant", "tool", "user"]
        # A chat completion on it: its messages are items too.
        ask(http, made.id, "What is my name?")
        after_chat = [item.id for item in api.conversations.items.list(made.id, order="asc", limit=100)]
        assert after_chat[:6] == ids and len(after_chat) == 8

        # Deleting an item takes it out of the branch: its child hangs under its parent.
        assert checked(Conversation, api.conversations.items.with_raw_response.delete(
            ids[2], conversation_id=made.id)).id == made.id
        left = [item.id for item in api.conversations.items.list(made.id, order="asc", limit=100)]
        assert left == [ids[0], ids[1], *ids[3:], *after_chat[6:]]
        tree = http.get(f"/backend-api/conversation/{made.id}").json()["messages"]
        assert tree[2]["id"] == ids[3] and tree[2]["parent_id"] == ids[1]

        # Errors: OpenAI's body, the field named.
        for call in (lambda: api.conversations.retrieve("conv_nope"), lambda: other.conversations.retrieve(made.id),
                     lambda: other.conversations.update(made.id, metadata={}),
                     lambda: other.conversations.items.list(made.id),
                     lambda: other.conversations.items.create(made.id, items=[{"role": "user", "content": "x"}]),
                     lambda: other.conversations.items.retrieve(ids[0], conversation_id=made.id),
                     lambda: other.conversations.items.delete(ids[0], conversation_id=made.id),
                     lambda: other.conversations.delete(made.id)):
            with pytest.raises(openai.NotFoundError) as missing:
                call()
            assert missing.value.body["code"] == "conversation_not_found"  # type: ignore[index]
        with pytest.raises(openai.NotFoundError) as no_item:
            api.conversations.items.retrieve("msg_nope", conversation_id=made.id)
        assert no_item.value.body["code"] == "item_not_found"  # type: ignore[index]
        refused = [
            ([{"type": "reasoning", "summary": []}], "items[0].type"),
            ([{"role": "user", "content": "ok"}, {"role": "user", "content": [{"type": "input_image",
                                                                                "image_url": "https://x/y.png"}]}],
             "items[1].content[0].type"),
            ([{"type": "web_search_call", "id": "ws_1", "status": "completed", "action": {"type": "search"}}],
             "items[0].type"),
            ([{"role": "robot", "content": "x"}], "items[0].role"),
            ([{"type": "function_call", "call_id": "c", "name": "f"}], "items[0].arguments"),
            ([{"role": "user", "content": "x"}] * 21, "items"),
        ]
        for items_sent, param in refused:
            with pytest.raises(openai.BadRequestError) as bad:
                api.conversations.items.create(made.id, items=items_sent)
            assert bad.value.body["param"] == param, bad.value.body  # type: ignore[index]
        with pytest.raises(openai.BadRequestError) as bad:
            api.conversations.create(items=[{"type": "image_generation_call", "id": "ig_1"}])
        assert bad.value.body["param"] == "items[0].type"  # type: ignore[index]
        with pytest.raises(openai.BadRequestError) as bad:
            api.conversations.create(metadata={"k" * 65: "v"})
        assert str(bad.value.body["param"]).startswith("metadata")  # type: ignore[index]
        with pytest.raises(openai.BadRequestError) as bad:
            api.conversations.create(metadata={str(n): "v" for n in range(17)})
        assert bad.value.body["param"] == "metadata"  # type: ignore[index]
        with pytest.raises(openai.BadRequestError) as bad:
            api.conversations.items.list(made.id, include=["message.output_text.logprobs"])
        assert bad.value.body["param"] == "include"  # type: ignore[index]

        gone = checked(ConversationDeletedResource, api.conversations.with_raw_response.delete(made.id))
        assert gone.deleted and gone.id == made.id
        with pytest.raises(openai.NotFoundError):
            api.conversations.items.list(made.id)
        assert http.get(f"/backend-api/conversation/{made.id}").status_code == 404
        empty = api.conversations.create()
        assert checked(ConversationItemList, api.conversations.items.with_raw_response.list(empty.id)).data == []


async def test_a_realtime_session_sees_the_items_of_a_public_conversation(stored: tuple[GatewayProcess, Path]) -> None:
    gateway, _ = stored
    with sdk(gateway) as api:
        made = api.conversations.create(items=[{"role": "user", "content": "My name is Ann."},
                                               {"role": "assistant", "content": "Hello Ann."}])
        ids = [item.id for item in api.conversations.items.list(made.id, order="asc")]
    loaded, done = await realtime_turn(gateway, made.id, "What is my name?")
    assert [item["id"] for item in loaded] == ids
    assert loaded[0]["content"] == [{"type": "input_text", "text": "My name is Ann."}]
    assert loaded[1]["content"][0]["text"] == "Hello Ann."
    with sdk(gateway) as api:
        for _ in range(100):  # the session's turn, written behind it
            items = api.conversations.items.list(made.id, order="asc").data
            if len(items) == 4 and items[3].content[0].text == done["response"]["output"][0]["content"][0]["text"]:
                break
            time.sleep(0.1)
    assert [item.id for item in items[:2]] == ids and items[2].content[0].text == "What is my name?"
    assert items[3].content[0].text == done["response"]["output"][0]["content"][0]["text"]


def sse_events(response: httpx.Response, limit: int | None = None) -> list[dict[str, Any]]:
    """Each event's id, event name and decoded data (`[DONE]` stays a string), up to `limit`."""
    events: list[dict[str, Any]] = []
    current: dict[str, Any] = {}
    for line in response.iter_lines():
        if not line:
            if current:
                events.append(current)
                current = {}
                if limit is not None and len(events) == limit:
                    break
            continue
        field, _, value = line.partition(": ")
        current[field] = value if field != "data" or value == "[DONE]" else json.loads(value)
    return events


def post_message(http: httpx.Client, conversation: str, **body: Any) -> list[dict[str, Any]]:
    with http.stream("POST", f"/backend-api/conversation/{conversation}/messages",
                     json={"model": MODEL, "max_tokens": 24, "temperature": 0, **body}) as response:
        assert response.status_code == 200, response.read()
        return sse_events(response)


def typed(events: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [e["data"] for e in events if isinstance(e["data"], dict) and e["data"].get("type") == kind]


def reply_text(events: list[dict[str, Any]]) -> str:
    deltas = [e["data"] for e in events if e.get("event") == "delta" and ("o" not in e["data"] or e["data"]["o"] == "append")]
    return "".join(d["v"] for d in deltas)


def test_the_seeds_streaming_api_patches_a_message_and_titles_the_conversation(
        stored: tuple[GatewayProcess, Path]) -> None:
    gateway, _ = stored
    with client(gateway) as http:
        conversation = http.post("/backend-api/conversations", json={}).json()["id"]
        events = post_message(http, conversation, content="How do plants make their food?")
        assert events[0]["event"] == "delta_encoding" and events[0]["data"] == "v1"
        token = events[1]["data"]["token"]
        assert events[1]["data"]["type"] == "resume_conversation_token"
        assert [e["id"] for e in events] == [f"{token}/{n}" for n in range(1, len(events) + 1)]
        added = events[2]["data"]
        assert (added["p"], added["o"]) == ("", "add") and added["v"]["message"]["status"] == "in_progress"
        assert events[3]["data"]["p"] == "/message/content/parts/0" and events[3]["data"]["o"] == "append"
        text_events = [e for e in events[4:] if e.get("event") == "delta" and e["data"].get("o") != "patch"]
        assert text_events and all(set(e["data"]) == {"v"} for e in text_events), "later deltas reuse path and op"
        final = next(e["data"] for e in events if e.get("event") == "delta" and e["data"].get("o") == "patch")
        assert final["v"][0] == {"p": "/message/status", "o": "replace", "v": "incomplete"}  # 24 tokens: cut short
        assert final["v"][1]["v"]["prewarmed"] is False
        (title,) = typed(events, "title_generation")
        assert title["title"] and events[-1]["data"] == "[DONE]"

        view = http.get(f"/backend-api/conversation/{conversation}").json()
        assert view["title"] == title["title"]
        user, reply = view["messages"]
        assert reply["id"] == added["v"]["message"]["id"] and reply["parent_id"] == user["id"]
        assert reply["content"][0]["text"] == reply_text(events) and reply["status"] == "incomplete"

        # Regenerate (no content): a sibling reply to the same user message, now the current leaf.
        again = post_message(http, conversation, parent_message_id=user["id"], temperature=1.0)
        assert not typed(again, "title_generation"), "only the first exchange is titled"
        view = http.get(f"/backend-api/conversation/{conversation}", params={"all_branches": "true"}).json()
        replies = [m for m in view["messages"] if m["parent_id"] == user["id"]]
        assert len(replies) == 2 and view["current_leaf_id"] == replies[1]["id"]
        # Edit the first message: a new root beside the old one.
        post_message(http, conversation, parent_message_id=None, content="How do fish breathe?")
        branch = http.get(f"/backend-api/conversation/{conversation}").json()["messages"]
        assert branch[0]["parent_id"] is None and branch[0]["content"][0]["text"] == "How do fish breathe?"

        url = f"/backend-api/conversation/{conversation}/messages"
        assert_error(http.post(url, json={"model": MODEL, "content": "x", "parent_message_id": "msg_nope"}),
                     404, "message_not_found")
        assert_error(http.post(url, json={"model": MODEL, "parent_message_id": replies[0]["id"]}), 400, "invalid_value")
        assert_error(http.post(url, json={"model": MODEL, "content": "x", "stream": True}), 400,
                     "unknown_parameter")
        assert_error(http.post("/backend-api/conversation/conv_nope/messages", json={"model": MODEL, "content": "x"}),
                     404, "conversation_not_found")
    with client(gateway, KEY_B) as other:
        assert_error(other.post(url, json={"model": MODEL, "content": "x"}), 404, "conversation_not_found")


def test_a_stored_reply_runs_on_when_its_client_leaves_and_resumes(stored: tuple[GatewayProcess, Path]) -> None:
    gateway, _ = stored
    with client(gateway) as http, client(gateway, KEY_B) as other:
        conversation = http.post("/backend-api/conversations", json={"title": "resumed"}).json()["id"]
        url = f"/backend-api/conversation/{conversation}/messages"
        body = {"model": MODEL, "max_tokens": 120, "temperature": 0, "content": "Tell me a long story about a fox."}
        with http.stream("POST", url, json=body) as response:
            before = sse_events(response, limit=6)
        time.sleep(0.3)
        last = before[-1]["id"]
        assert_error(other.post(url, json=body, headers={"last-event-id": last}), 404, "stream_not_found")
        assert_error(http.post(url, json={**body, "content": "Tell me about a dog."}, headers={"last-event-id": last}),
                     422, "last_event_id_reused")
        with http.stream("POST", url, json=body, headers={"last-event-id": last}) as response:
            after = sse_events(response)
        events = before + after
        token = before[1]["data"]["token"]
        assert [e["id"] for e in events] == [f"{token}/{n}" for n in range(1, len(events) + 1)], "no gaps, no duplicates"
        assert after[-1]["data"] == "[DONE]"
        reply = http.get(f"/backend-api/conversation/{conversation}").json()["messages"][-1]
        assert reply["content"][0]["text"] == reply_text(events) and reply["status"] in ("completed", "incomplete")
        print(f"SSE resume: {len(before)} events before the drop, {len(after)} after it")

        # A client that leaves for good: the reply is still generated to its end and stored.
        with http.stream("POST", url, json={**body, "content": "Tell me another story."}) as response:
            sse_events(response, limit=4)
        for _ in range(100):
            reply = http.get(f"/backend-api/conversation/{conversation}").json()["messages"][-1]
            if reply["status"] != "in_progress":
                break
            time.sleep(0.1)
        assert reply["status"] in ("completed", "incomplete") and reply["usage"]["output_tokens"] >= 20


def test_a_prepared_draft_is_prewarmed_and_prepares_are_bounded(stored: tuple[GatewayProcess, Path]) -> None:
    gateway, _ = stored
    draft = "Summarise this: " + "the quick brown fox jumps over the lazy dog. " * 20
    with client(gateway) as http:
        conversation = http.post("/backend-api/conversations", json={"title": "warm"}).json()["id"]
        prepared = http.post(f"/backend-api/conversation/{conversation}/prepare", json={"content": draft})
        assert prepared.status_code == 202 and prepared.json()["prompt_tokens"] > 200
        # The prefill is done once the engine is idle (on a loaded machine a fixed wait was not always enough).
        deadline = time.monotonic() + 60
        while (engine_stat(http, "queue_depth") or engine_stat(http, "active")) and time.monotonic() < deadline:
            time.sleep(0.1)
        events = post_message(http, conversation, content=draft, max_tokens=4)
        final = next(e["data"] for e in events if e.get("event") == "delta" and e["data"].get("o") == "patch")
        metadata = final["v"][1]["v"]
        assert metadata["prewarmed"] is True and metadata["usage"]["cached_tokens"] >= prepared.json()["prompt_tokens"] - 1, \
            (metadata, prepared.json(), time.monotonic() - deadline + 60)

        assert_error(http.post(f"/backend-api/conversation/{conversation}/prepare", json={"content": ""}), 400, "invalid_value")
        # A storm from one key: two prefills in flight at most (each of a long draft takes a while).
        long_draft = "Read this carefully: " + "every morning the baker lights the oven and sings. " * 150
        others = [http.post("/backend-api/conversations", json={}).json()["id"] for _ in range(3)]
        answers = [http.post(f"/backend-api/conversation/{c}/prepare", json={"content": long_draft}) for c in others]
        assert [a.status_code for a in answers[:2]] == [202, 202]
        assert_error(answers[2], 429, "too_many_prepares")


def engine_stat(http: httpx.Client, name: str) -> float:
    line = next(line for line in http.get("/metrics").text.splitlines() if line.startswith(f"gateway_engine_{name} "))
    return float(line.split()[1])


def test_a_storm_of_prepares_from_one_key_leaves_another_keys_prepare_working(tmp_path: Path) -> None:
    """A cache of ~7 drafts' KV: one key's 12 prepares would pin it full and push out another key's
    prepared draft; the key keeps only its newest PINNED_PER_KEY pinned."""
    gateway = start_gateway("--api-keys", f"{KEY_A},{KEY_B}", "--no-load-voice-models", "--prefix-cache-mb", "100",
                            "--data-dir", str(tmp_path / "data"), log_path=tmp_path / "gateway.log")
    # ~640 tokens each (~14 MB of KV); distinct from their first words, so no two share their KV.
    drafts = [f"Draft {n}. Read this carefully: " + "every morning the baker lights the oven and sings. " * 60
              for n in range(13)]
    try:
        with client(gateway, KEY_B) as other, client(gateway) as storm:
            mine = other.post("/backend-api/conversations", json={}).json()["id"]
            assert other.post(f"/backend-api/conversation/{mine}/prepare", json={"content": drafts[0]}).status_code == 202
            for draft in drafts[1:]:
                conversation = storm.post("/backend-api/conversations", json={}).json()["id"]
                while (answer := storm.post(f"/backend-api/conversation/{conversation}/prepare",
                                            json={"content": draft})).status_code == 429:
                    time.sleep(0.1)  # two in flight: the next one waits for a slot
                assert answer.status_code == 202, answer.text
            while engine_stat(storm, "queue_depth") or engine_stat(storm, "active"):
                time.sleep(0.1)
            assert engine_stat(storm, "conversations_pinned") == PINNED_PER_KEY + 1, "the storm's newest, and key B's"
            events = post_message(other, mine, content=drafts[0], max_tokens=4)
        final = next(e["data"] for e in events if e.get("event") == "delta" and e["data"].get("o") == "patch")
        assert final["v"][1]["v"]["prewarmed"] is True
    finally:
        gateway.stop()


async def realtime_turn(gateway: GatewayProcess, conversation: str, question: str,
                        key: str = KEY_A) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Open a Realtime session on the stored conversation, ask in text; the items it loaded and response.done."""
    client = await RealtimeClient.connect(f"{gateway.ws_url}/v1/realtime?model={MODEL}&conversation={conversation}",
                                          headers={"authorization": f"Bearer {key}"})
    try:
        created = await client.recv()
        assert created["type"] == "session.created"
        await client.send({"type": "session.update", "session": {"output_modalities": ["text"], "temperature": 0,
                                                                 "max_output_tokens": 12}})
        await client.wait_for("session.updated")
        loaded = [e["item"] for e in client.of_type("conversation.item.done")]
        done = await client.ask(question)
        return loaded, done
    finally:
        await client.close()


async def test_a_realtime_session_continues_a_stored_conversation(stored: tuple[GatewayProcess, Path]) -> None:
    gateway, _ = stored
    with client(gateway) as http:
        conversation = http.post("/backend-api/conversations", json={}).json()["id"]
        ask(http, conversation, "My name is Ann.")
        before = http.get(f"/backend-api/conversation/{conversation}").json()["messages"]
    loaded, done = await realtime_turn(gateway, conversation, "What is my name?")
    assert [item["id"] for item in loaded] == [m["id"] for m in before], "the stored branch, as items"
    assert loaded[0]["content"] == [{"type": "input_text", "text": "My name is Ann."}]
    assert done["response"]["conversation_id"] == conversation
    with client(gateway) as http:
        for _ in range(50):  # written behind the session
            after = http.get(f"/backend-api/conversation/{conversation}").json()["messages"]
            if len(after) == 4 and after[3]["usage"] is not None:
                break
            time.sleep(0.1)
    assert [m["role"] for m in after] == ["user", "assistant", "user", "assistant"]
    assert after[2]["content"] == [{"type": "text", "text": "What is my name?"}] and after[2]["parent_id"] == before[1]["id"]
    assert after[3]["content"][0]["text"] == done["response"]["output"][0]["content"][0]["text"]
    assert after[3]["usage"]["output_tokens"] == done["response"]["usage"]["output_tokens"]
    assert after[3]["latency"] == json.loads(done["response"]["metadata"]["gateway_latency"])
    assert after[3]["status"] in ("completed", "incomplete")

    # Titles come after the first exchange, whichever API made it (written in the background).
    with client(gateway) as http:
        fresh = http.post("/backend-api/conversations", json={}).json()["id"]
    await realtime_turn(gateway, fresh, "How do bees make honey?")
    with client(gateway) as http:
        for _ in range(100):
            titles = [http.get(f"/backend-api/conversation/{c}").json()["title"] for c in (conversation, fresh)]
            if all(titles):
                break
            time.sleep(0.1)
    assert all(isinstance(title, str) and title for title in titles), titles

    refused = await RealtimeClient.connect(f"{gateway.ws_url}/v1/realtime?model={MODEL}&conversation={conversation}",
                                           headers={"authorization": f"Bearer {KEY_B}"})
    error = await refused.recv()
    assert error["type"] == "error" and error["error"]["code"] == "conversation_not_found"


async def open_realtime(gateway: GatewayProcess, conversation: str, max_output_tokens: int) -> RealtimeClient:
    """A text session on the stored conversation, its loaded items received."""
    client = await RealtimeClient.connect(f"{gateway.ws_url}/v1/realtime?model={MODEL}&conversation={conversation}",
                                          headers={"authorization": f"Bearer {KEY_A}"})
    assert (await client.recv())["type"] == "session.created"
    await client.send({"type": "session.update", "session": {"output_modalities": ["text"], "temperature": 0,
                                                             "max_output_tokens": max_output_tokens}})
    await client.wait_for("session.updated")
    return client


async def start_story(client: RealtimeClient, deltas: int) -> list[str]:
    """Ask for a long story; the text of its first `deltas` deltas."""
    await client.send({"type": "conversation.item.create", "item": {"type": "message", "role": "user", "content": [
        {"type": "input_text", "text": "Write a long story about a lighthouse keeper."}]}})
    await client.send({"type": "response.create"})
    streamed: list[str] = []
    while len(streamed) < deltas:
        streamed.append((await client.wait_for("response.output_text.delta"))["delta"])
    return streamed


def stored_messages(gateway: GatewayProcess, conversation: str, count: int) -> list[dict[str, Any]]:
    """The current branch, once it has `count` messages and the last one is finished (written behind)."""
    with client(gateway) as http:
        for _ in range(100):
            messages = http.get(f"/backend-api/conversation/{conversation}").json()["messages"]
            if len(messages) == count and messages[-1]["status"] != "in_progress":
                break
            time.sleep(0.1)
    return messages


async def test_a_cancelled_realtime_reply_is_stored_as_cancelled(stored: tuple[GatewayProcess, Path]) -> None:
    gateway, _ = stored
    with client(gateway) as http:
        conversation = http.post("/backend-api/conversations", json={"title": "cancelled"}).json()["id"]
    session = await open_realtime(gateway, conversation, max_output_tokens=400)
    try:
        await start_story(session, deltas=5)
        await session.send({"type": "response.cancel"})
        done = await session.wait_for("response.done")
    finally:
        await session.close()
    assert done["response"]["status"] == "cancelled"
    user, reply = stored_messages(gateway, conversation, 2)
    assert user["status"] == "completed" and reply["status"] == "cancelled"
    assert reply["content"][0]["text"] == done["response"]["output"][0]["content"][0]["text"]
    if done["response"]["usage"] is None:  # a busy engine's counts came after the cancel stopped waiting (USAGE_WAIT_S)
        assert reply["usage"] is None
    else:
        assert reply["usage"]["output_tokens"] == done["response"]["usage"]["output_tokens"] < 400


async def test_sigkill_mid_realtime_response_keeps_the_text_streamed(tmp_path: Path) -> None:
    gateway = start(tmp_path)
    try:
        with client(gateway) as http:
            conversation = http.post("/backend-api/conversations", json={"title": "survivor"}).json()["id"]
            done = ask(http, conversation, "Say hello.")
        session = await open_realtime(gateway, conversation, max_output_tokens=400)
        streamed = await start_story(session, deltas=40)
        await asyncio.sleep(0.3)  # past the recorder's flush interval: the text so far is committed
        assert gateway.process is not None
        os.kill(gateway.process.pid, signal.SIGKILL)
        gateway.process.wait(10)
        await session.close()
    finally:
        gateway.stop()
    with sqlite3.connect(tmp_path / "data" / "gateway.db") as check:
        assert check.execute("PRAGMA integrity_check").fetchone() == ("ok",)

    restarted = start(tmp_path)
    try:
        with client(restarted) as http:
            messages = http.get(f"/backend-api/conversation/{conversation}").json()["messages"]
    finally:
        restarted.stop()
    assert [m["role"] for m in messages] == ["user", "assistant", "user", "assistant"]
    finished = "incomplete" if done["choices"][0]["finish_reason"] == "length" else "completed"
    assert [m["status"] for m in messages[:3]] == ["completed", finished, "completed"]
    assert messages[1]["content"][0]["text"] == done["choices"][0]["message"]["content"]
    assert messages[2]["content"] == [{"type": "text", "text": "Write a long story about a lighthouse keeper."}]
    interrupted = messages[3]
    assert interrupted["status"] == "incomplete" and interrupted["model"] == MODEL
    # What the client had 0.3 s before the kill is all there (the recorder lags by at most 0.1 s).
    assert interrupted["content"][0]["text"].startswith("".join(streamed)), (interrupted["content"], streamed)


def test_sigkill_mid_stream_loses_nothing_committed(stored: tuple[GatewayProcess, Path]) -> None:
    gateway, tmp = stored
    with client(gateway) as http:
        conversation = http.post("/backend-api/conversations", json={"title": "survivor"}).json()["id"]
        done = ask(http, conversation, "Say hello.")
        streamed: list[str] = []
        body = {"model": MODEL, "max_tokens": 400, "temperature": 0, "stream": True, "conversation": conversation,
                "messages": [{"role": "user", "content": "Write a long story about a lighthouse keeper."}]}
        with http.stream("POST", "/v1/chat/completions", json=body) as response:
            for line in response.iter_lines():
                if line.startswith("data: {"):
                    delta = json.loads(line[6:])["choices"][0]["delta"].get("content")
                    if delta:
                        streamed.append(delta)
                if len(streamed) >= 40:
                    time.sleep(0.3)  # past the writer's flush interval: the text so far is committed
                    assert gateway.process is not None
                    os.kill(gateway.process.pid, signal.SIGKILL)
                    break
    gateway.process.wait(10)
    database = tmp / "data" / "gateway.db"
    with sqlite3.connect(database) as check:
        assert check.execute("PRAGMA integrity_check").fetchone() == ("ok",)

    restarted = start(tmp)
    try:
        with client(restarted) as http:
            messages = http.get(f"/backend-api/conversation/{conversation}").json()["messages"]
        assert [m["role"] for m in messages] == ["user", "assistant", "user", "assistant"]
        finished = "incomplete" if done["choices"][0]["finish_reason"] == "length" else "completed"
        assert [m["status"] for m in messages[:3]] == ["completed", finished, "completed"]
        assert messages[1]["content"][0]["text"] == done["choices"][0]["message"]["content"]
        interrupted = messages[3]
        assert interrupted["status"] == "incomplete"
        text = interrupted["content"][0]["text"]
        # What the client had 0.3 s before the kill is all there (the writer lags by at most 0.1 s); the
        # generation went on meanwhile, so the stored text may be longer.
        assert text.startswith("".join(streamed)), (text, streamed)
        # A Realtime session continues it after the restart: the four messages, then its own turn.
        loaded, done = asyncio.run(realtime_turn(restarted, conversation, "Thanks."))
        assert [item["id"] for item in loaded] == [m["id"] for m in messages]
        assert loaded[3]["status"] == "incomplete" and done["response"]["status"] in ("completed", "incomplete")
        # So does a chat completion: the whole branch (recomputed, the KV cache is gone) is its history.
        before = stored_messages(restarted, conversation, 6)
        with client(restarted) as http:
            alone = ask(http, None, "What was my first question?")
            again = ask(http, conversation, "What was my first question?")
            after = http.get(f"/backend-api/conversation/{conversation}").json()["messages"]
        assert again["usage"]["prompt_tokens"] > alone["usage"]["prompt_tokens"] + 50
        assert [m["id"] for m in after[:6]] == [m["id"] for m in before] and len(after) == 8
        assert after[6]["parent_id"] == before[5]["id"] and after[6]["content"][0]["text"] == "What was my first question?"
        assert after[7]["content"][0]["text"] == again["choices"][0]["message"]["content"]
    finally:
        gateway.process = restarted.process  # the module fixture stops whichever runs now

