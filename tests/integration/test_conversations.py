"""Stored conversations against the real gateway and a real SQLite file: the REST API, its pagination and
ownership, chat completions attached to a conversation (history, branches), and SIGKILL mid-stream."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.gateway_process import GatewayProcess, start_gateway
from tests.integration.conftest import MODEL

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
        made = [http.post("/v1/conversations", json={"title": f"chat {i}"}).json() for i in range(5)]
        assert all(c["object"] == "conversation" and c["id"].startswith("conv_") for c in made)
        assert other.get("/v1/conversations").json()["data"] == []  # another key sees none of them

        seen: list[str] = []
        after = None
        while True:
            page = http.get("/v1/conversations", params={"limit": 2, **({"after": after} if after else {})}).json()
            seen += [c["id"] for c in page["data"]]
            assert len(page["data"]) <= 2 and page["last_id"] == page["data"][-1]["id"]
            if not page["has_more"]:
                break
            after = page["last_id"]
        assert seen == [c["id"] for c in reversed(made)]  # newest first, each once
        oldest_first = http.get("/v1/conversations", params={"order": "asc", "limit": 100}).json()["data"]
        assert [c["id"] for c in oldest_first] == [c["id"] for c in made]

        target = made[0]["id"]
        renamed = http.patch(f"/v1/conversations/{target}", json={"title": "renamed"})
        assert renamed.status_code == 200 and renamed.json()["title"] == "renamed"
        for response in (other.get(f"/v1/conversations/{target}"), other.delete(f"/v1/conversations/{target}"),
                         other.patch(f"/v1/conversations/{target}", json={"title": "mine"}),
                         other.get(f"/v1/conversations/{target}/messages"),
                         other.post("/v1/chat/completions", json={"model": MODEL, "conversation": target,
                                                                  "messages": [{"role": "user", "content": "hi"}]})):
            assert_error(response, 404, "conversation_not_found")  # 404, not 403: its existence is not told
        assert_error(http.get("/v1/conversations/conv_nope"), 404, "conversation_not_found")
        assert_error(http.patch(f"/v1/conversations/{target}", json={}), 400, "invalid_value")
        assert http.patch(f"/v1/conversations/{target}", json={"colour": "red"}).status_code == 400
        assert_error(http.get("/v1/conversations", params={"limit": 0}), 422, "invalid_value")
        assert_error(http.get("/v1/conversations", params={"order": "sideways"}), 422, "invalid_value")
        assert http.post("/v1/conversations", content=b"[1]").status_code == 400
        assert httpx.get(f"{gateway.url}/v1/conversations").status_code == 401

        deleted = http.delete(f"/v1/conversations/{target}")
        assert deleted.json() == {"id": target, "object": "conversation.deleted", "deleted": True}
        assert_error(http.get(f"/v1/conversations/{target}"), 404, "conversation_not_found")
        assert_error(http.delete(f"/v1/conversations/{target}"), 404, "conversation_not_found")


def test_chat_completions_continue_a_conversation_and_branch(stored: tuple[GatewayProcess, Path]) -> None:
    gateway, _ = stored
    with client(gateway) as http:
        conversation = http.post("/v1/conversations", json={}).json()["id"]
        alone = ask(http, None, "What is two plus two?")
        first = ask(http, conversation, "My name is Ann.")
        second = ask(http, conversation, "What is two plus two?")
        # The second turn's prompt holds the first exchange, and the engine's cache has its prefix.
        assert second["usage"]["prompt_tokens"] > alone["usage"]["prompt_tokens"] + 5
        assert second["usage"]["prompt_tokens_details"]["cached_tokens"] > 0

        view = http.get(f"/v1/conversations/{conversation}").json()
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
        assert http.patch(f"/v1/conversations/{conversation}", json={"current_leaf_id": branch[1]["id"]}).status_code == 200
        ask(http, conversation, "What is three plus three?")
        current = http.get(f"/v1/conversations/{conversation}").json()["messages"]
        assert [m["id"] for m in current[:2]] == [m["id"] for m in branch[:2]]
        assert current[2]["content"][0]["text"] == "What is three plus three?" and current[2]["parent_id"] == branch[1]["id"]
        everything = http.get(f"/v1/conversations/{conversation}", params={"all_branches": "true"}).json()["messages"]
        assert len(everything) == 6 and sum(1 for m in everything if m["parent_id"] == branch[1]["id"]) == 2

        pages: list[dict[str, Any]] = []
        after = None
        while True:
            page = http.get(f"/v1/conversations/{conversation}/messages",
                            params={"limit": 4, **({"after": after} if after else {})}).json()
            pages += page["data"]
            if not page["has_more"]:
                break
            after = page["last_id"]
        assert [m["id"] for m in pages] == [m["id"] for m in everything]  # oldest first, each once

        other = http.post("/v1/conversations", json={}).json()["id"]
        assert_error(http.patch(f"/v1/conversations/{other}", json={"current_leaf_id": branch[1]["id"]}),
                     404, "message_not_found")


def test_sigkill_mid_stream_loses_nothing_committed(stored: tuple[GatewayProcess, Path]) -> None:
    gateway, tmp = stored
    with client(gateway) as http:
        conversation = http.post("/v1/conversations", json={"title": "survivor"}).json()["id"]
        done = ask(http, conversation, "Say hello.")
        streamed: list[str] = []
        body = {"model": MODEL, "max_tokens": 400, "stream": True, "conversation": conversation,
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
            messages = http.get(f"/v1/conversations/{conversation}").json()["messages"]
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
    finally:
        gateway.process = restarted.process  # the module fixture stops whichever runs now
