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


def chat(process: GatewayProcess, key: str, text: str, *, stream: bool = False, **extra: Any) -> dict[str, Any]:
    response = call(process, key, "POST", "/v1/chat/completions", {
        "model": MODEL, "max_tokens": 16, "temperature": 0, "stream": stream,
        "messages": [{"role": "user", "content": text}], **extra})
    assert response.status_code == 200, response.text
    if not stream:
        return response.json()  # type: ignore[no-any-return]
    chunks = [json.loads(line[6:]) for line in response.text.splitlines() if line.startswith("data: {")]
    assert all("metadata" not in chunk for chunk in chunks[:-1])  # on the last: the reply may have saved one
    return {"metadata": chunks[-1].get("metadata"), "content": "".join(
        c["choices"][0]["delta"].get("content") or "" for c in chunks if c.get("choices")),
        "deltas": [c["choices"][0]["delta"] for c in chunks if c.get("choices")]}


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
    # The memory tool's description comes before the facts, which change with the question: it stays cached.
    assert recalled["usage"]["prompt_tokens_details"]["cached_tokens"] >= 100, recalled["usage"]
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


FORCE_REMEMBER = {"type": "function", "function": {"name": "remember"}}
TELL = "My favourite colour is green."


def test_the_model_saves_a_memory_through_the_built_in_tool(memory_gateway: GatewayProcess) -> None:
    """The small model does not call `remember` of its own accord, so tool_choice names it: the call is made under
    the grammar, run by the gateway out of the client's sight, and the reply goes on in a second round."""
    key = KEYS[0]
    refused = call(memory_gateway, key, "POST", "/v1/chat/completions", {
        "model": MODEL, "messages": [{"role": "user", "content": TELL}], "tool_choice": FORCE_REMEMBER})
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "tool_choice"  # memory is off
    plain = chat(memory_gateway, key, TELL, max_tokens=40)

    assert call(memory_gateway, key, "POST", "/v1/memories/settings", {"enabled": True}).status_code == 200
    try:
        answer = chat(memory_gateway, key, TELL, max_tokens=40, tool_choice=FORCE_REMEMBER)
        saved = answer["metadata"]["memories_saved"]
        kept = memories(memory_gateway, key)["data"]
        assert saved and [m["id"] for m in kept] == [saved] and kept[0]["content"].strip()
        message = answer["choices"][0]
        assert message["finish_reason"] != "tool_calls" and not message["message"].get("tool_calls")
        assert message["message"]["content"] and "<tool_call>" not in message["message"]["content"]
        # Two rounds, both counted: the first's prompt describes the tool, the second reads the call and its result.
        assert answer["usage"]["prompt_tokens"] > 2 * plain["usage"]["prompt_tokens"]

        streamed = chat(memory_gateway, key, "I live in Berlin.", stream=True, max_tokens=40, tool_choice=FORCE_REMEMBER)
        assert streamed["metadata"]["memories_saved"] not in ("", saved)
        assert all("tool_calls" not in delta for delta in streamed["deltas"]) and "<tool_call>" not in streamed["content"]
        assert len(memories(memory_gateway, key)["data"]) == 2

        # A client's own function of that name is the client's: called back, nothing saved.
        mine = {"type": "function", "function": {"name": "remember", "parameters": {
            "type": "object", "properties": {"note": {"type": "string"}}, "required": ["note"]}}}
        theirs = chat(memory_gateway, key, TELL, max_tokens=40, tools=[mine], tool_choice=FORCE_REMEMBER)
        assert theirs["choices"][0]["finish_reason"] == "tool_calls"
        assert json.loads(theirs["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"]).keys() == {"note"}
        assert theirs["metadata"]["memories_saved"] == "" and len(memories(memory_gateway, key)["data"]) == 2
    finally:
        call(memory_gateway, key, "DELETE", "/v1/memories")
        call(memory_gateway, key, "POST", "/v1/memories/settings", {"enabled": False})


async def test_a_realtime_response_saves_through_the_tool(memory_gateway: GatewayProcess) -> None:
    key = KEYS[1]
    client = await RealtimeClient.connect(f"{memory_gateway.ws_url}/v1/realtime?model={MODEL}",
                                          headers={"authorization": f"Bearer {key}"})
    await client.wait_for("session.created")
    await client.send({"type": "session.update", "session": {"type": "realtime", "output_modalities": ["text"]}})
    force = {"type": "function", "name": "remember"}
    failed = await client.ask(TELL, max_output_tokens=32, tool_choice=force)  # memory off: refused by name
    assert failed["response"]["status"] == "failed" and failed["response"]["status_details"]["error"]["code"] == \
        "invalid_value"
    assert call(memory_gateway, key, "POST", "/v1/memories/settings", {"enabled": True}).status_code == 200
    try:
        done = await client.ask(TELL, max_output_tokens=32, tool_choice=force)
        saved = done["response"]["metadata"]["memories_saved"]
        assert saved and [m["id"] for m in memories(memory_gateway, key)["data"]] == [saved]
        assert [item["type"] for item in done["response"]["output"]] == ["message"]  # the call is not the client's
        assert done["response"]["status"] == "completed"
    finally:
        await client.close()
        call(memory_gateway, key, "DELETE", "/v1/memories")
        call(memory_gateway, key, "POST", "/v1/memories/settings", {"enabled": False})


def test_stored_replies_list_their_memories(memory_gateway: GatewayProcess) -> None:
    """The streaming conversation API recalls and saves too, and each stored reply keeps its memories."""
    key = KEYS[0]
    assert call(memory_gateway, key, "POST", "/v1/memories/settings", {"enabled": True}).status_code == 200
    try:
        conversation = call(memory_gateway, key, "POST", "/backend-api/conversations", {}).json()["id"]
        url = f"/backend-api/conversation/{conversation}/messages"
        told = call(memory_gateway, key, "POST", url, {"model": MODEL, "content": REMEMBER, "max_tokens": 8})
        patches = [json.loads(line[6:]) for line in told.text.splitlines() if line.startswith("data: {")]
        final = next(p for p in patches if p.get("o") == "patch")["v"][1]["v"]
        rex = memories(memory_gateway, key)["data"][0]["id"]
        assert final["memories_saved"] == rex and final["memories_used"] == ""
        asked = call(memory_gateway, key, "POST", url, {"model": MODEL, "content": ASK, "max_tokens": 8, "temperature": 0})
        assert asked.status_code == 200
        stored = call(memory_gateway, key, "GET", f"{url}?order=asc").json()["data"]
        assert [m["role"] for m in stored] == ["user", "assistant", "user", "assistant"]
        assert [m["metadata"] for m in stored] == [None, {"memories_used": "", "memories_saved": rex}, None,
                                                   {"memories_used": rex, "memories_saved": ""}]

        # Chat completions attached to the conversation store theirs as well.
        attached = chat(memory_gateway, key, ASK, conversation=conversation)
        assert attached["metadata"]["memories_used"] == rex
        last = call(memory_gateway, key, "GET", f"{url}?order=desc&limit=1").json()["data"][0]
        assert last["role"] == "assistant" and last["metadata"] == attached["metadata"]
    finally:
        call(memory_gateway, key, "DELETE", "/v1/memories")
        call(memory_gateway, key, "POST", "/v1/memories/settings", {"enabled": False})
