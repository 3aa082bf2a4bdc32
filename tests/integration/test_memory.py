"""Memory on a real gateway: off by default (nothing stored), a key turns it on, a fact the user asks to be
remembered is stored (redacted by the policy) and put into a new conversation's context, each answer lists the
memories it used, and GET / DELETE /v1/memories show and erase them; another key sees none of it."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.gateway_process import GatewayProcess, start_gateway
from tests.integration.conftest import MODEL
from tests.integration.realtime_client import RealtimeClient

KEYS = ("sk-memory-one", "sk-memory-two")
REMEMBER = "Remember that my dog is called Rex."
ASK = "What is my dog called?"


@pytest.fixture(scope="module")
def memory_gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    folder = tmp_path_factory.mktemp("memory")
    process = start_gateway("--api-keys", ",".join(KEYS), "--no-load-voice-models", "--data-dir", str(folder / "data"),
                            log_path=folder / "gateway.log")
    yield process
    process.stop()


def call(process: GatewayProcess, key: str, method: str, path: str, body: Any = None) -> httpx.Response:
    return httpx.request(method, f"{process.url}{path}", headers={"authorization": f"Bearer {key}"}, json=body,
                         timeout=120)


def chat(process: GatewayProcess, key: str, text: str, *, stream: bool = False) -> dict[str, Any]:
    response = call(process, key, "POST", "/v1/chat/completions", {
        "model": MODEL, "max_tokens": 16, "temperature": 0, "stream": stream,
        "messages": [{"role": "user", "content": text}]})
    assert response.status_code == 200, response.text
    if not stream:
        return response.json()  # type: ignore[no-any-return]
    chunks = [json.loads(line[6:]) for line in response.text.splitlines() if line.startswith("data: {")]
    return {"metadata": chunks[0].get("metadata"), "content": "".join(
        c["choices"][0]["delta"].get("content") or "" for c in chunks if c.get("choices"))}


def memories(process: GatewayProcess, key: str) -> dict[str, Any]:
    listed = call(process, key, "GET", "/v1/memories")
    assert listed.status_code == 200
    return listed.json()  # type: ignore[no-any-return]


def test_memory(memory_gateway: GatewayProcess) -> None:
    one, two = KEYS
    # Off by default: nothing stored, no metadata.
    answer = chat(memory_gateway, one, REMEMBER)
    assert "metadata" not in answer
    assert memories(memory_gateway, one) == {"object": "list", "enabled": False, "data": []}
    without = chat(memory_gateway, one, ASK)

    assert call(memory_gateway, one, "POST", "/v1/memories/settings", {"enabled": True}).json()["enabled"] is True
    assert call(memory_gateway, one, "GET", "/v1/memories/settings").json()["enabled"] is True
    saved = chat(memory_gateway, one, REMEMBER)
    kept = memories(memory_gateway, one)
    assert kept["enabled"] is True and [m["content"] for m in kept["data"]] == ["my dog is called Rex"]
    rex = kept["data"][0]["id"]
    assert saved["metadata"] == {"memories_used": "", "memories_saved": rex}
    personal = chat(memory_gateway, one, "Please remember: my e-mail is jane.roe@example.org")
    mail = personal["metadata"]["memories_saved"]
    assert memories(memory_gateway, one)["data"][0] == {**memories(memory_gateway, one)["data"][0],
                                                         "id": mail, "content": "my e-mail is [email]"}

    # A new conversation gets the memory that bears on the question (not the unrelated one), and says so.
    recalled = chat(memory_gateway, one, ASK)
    assert recalled["metadata"] == {"memories_used": rex, "memories_saved": ""}
    assert recalled["usage"]["prompt_tokens"] > without["usage"]["prompt_tokens"]  # the fact is in the context
    assert "Rex" in recalled["choices"][0]["message"]["content"]
    streamed = chat(memory_gateway, one, ASK, stream=True)
    assert streamed["metadata"] == {"memories_used": rex, "memories_saved": ""}

    # Another key: its own (empty, off) memory, and it cannot delete ours.
    assert memories(memory_gateway, two) == {"object": "list", "enabled": False, "data": []}
    assert "metadata" not in chat(memory_gateway, two, ASK)
    assert call(memory_gateway, two, "DELETE", f"/v1/memories/{rex}").json()["error"]["code"] == "memory_not_found"

    # Erase one, then all; off again stores nothing more.
    assert call(memory_gateway, one, "DELETE", f"/v1/memories/{rex}").json()["deleted"] is True
    assert [m["id"] for m in memories(memory_gateway, one)["data"]] == [mail]
    assert chat(memory_gateway, one, ASK)["metadata"]["memories_used"] == ""
    assert call(memory_gateway, one, "DELETE", "/v1/memories").json() == {"object": "memory.deleted", "deleted": 1}
    assert call(memory_gateway, one, "POST", "/v1/memories/settings", {"enabled": False}).status_code == 200
    assert "metadata" not in chat(memory_gateway, one, REMEMBER)
    assert memories(memory_gateway, one) == {"object": "list", "enabled": False, "data": []}


@pytest.mark.parametrize(("body", "param"), [({"enabled": "yes"}, "enabled"), ({}, "enabled"),
                                             ({"enabled": True, "scope": "all"}, "scope")])
def test_bad_settings_are_refused_by_name(memory_gateway: GatewayProcess, body: dict[str, Any], param: str) -> None:
    refused = call(memory_gateway, KEYS[0], "POST", "/v1/memories/settings", body)
    assert refused.status_code == 400 and refused.json()["error"]["param"] == param


async def test_realtime_sessions_recall_and_save(memory_gateway: GatewayProcess) -> None:
    key = KEYS[1]
    assert call(memory_gateway, key, "POST", "/v1/memories/settings", {"enabled": True}).status_code == 200
    cat = chat(memory_gateway, key, "Remember that my cat is called Tom.")["metadata"]["memories_saved"]
    client = await RealtimeClient.connect(f"{memory_gateway.ws_url}/v1/realtime?model={MODEL}",
                                          headers={"authorization": f"Bearer {key}"})
    await client.wait_for("session.created")
    await client.send({"type": "session.update", "session": {"type": "realtime", "output_modalities": ["text"]}})
    done = await client.ask("What is my cat called?", max_output_tokens=16)  # events checked against the SDK's types
    assert done["response"]["metadata"]["memories_used"] == cat
    assert "Tom" in done["response"]["output"][0]["content"][0]["text"]
    saved = await client.ask("Remember that my car is red.", max_output_tokens=4)
    await client.close()
    car = saved["response"]["metadata"]["memories_saved"]
    assert car and [m["content"] for m in memories(memory_gateway, key)["data"]] == ["my car is red", "my cat is called Tom"]
    assert call(memory_gateway, key, "DELETE", "/v1/memories").json()["deleted"] == 2
    assert call(memory_gateway, key, "POST", "/v1/memories/settings", {"enabled": False}).status_code == 200
