"""A conversation's title (issue 28): the embedded model writes it under a grammar (a few title-case words,
no punctuation), not as the reply's truncated first sentence (`The answer would be "Mount Etna" by the
way, but I can`). The fallback to the user's first words, for a backend that takes no grammar, is checked
against a remote backend in test_remote_backend.py."""

from __future__ import annotations

import json
import re
import time

import httpx

from tests.gateway_process import GatewayProcess
from tests.integration.conftest import MODEL


def assert_a_title(title: str, reply: str) -> None:
    words = title.split()
    assert 1 <= len(words) <= 6, title
    assert re.fullmatch(r"[\w' -]+", title) and not title.endswith(("'", "-")), title  # no punctuation
    assert not reply.lower().startswith(title.lower()), (title, reply)  # not the reply cut short


def test_the_model_titles_a_conversation_in_a_few_words(gateway: GatewayProcess) -> None:
    with httpx.Client(base_url=gateway.url, timeout=120) as http:
        # The conversation API: the title comes in the stream, before [DONE], and is stored.
        for question in ("What is the capital of France?", "Can you help me write a cover letter for a nursing job?"):
            conversation = http.post("/backend-api/conversations", json={}).json()["id"]
            with http.stream("POST", f"/backend-api/conversation/{conversation}/messages",
                             json={"model": MODEL, "content": question, "max_tokens": 40, "temperature": 0}) as sse:
                events = [json.loads(line[6:]) for line in sse.iter_lines() if line.startswith("data: {")]
            (title,) = [e["title"] for e in events if e.get("type") == "title_generation"]
            view = http.get(f"/backend-api/conversation/{conversation}").json()
            assert view["title"] == title
            assert_a_title(title, view["messages"][-1]["content"][0]["text"])

        # A chat completion attached to a conversation: titled in the background.
        conversation = http.post("/backend-api/conversations", json={}).json()["id"]
        question = "How do I reverse a list in Python?"
        reply = http.post("/v1/chat/completions", json={
            "model": MODEL, "messages": [{"role": "user", "content": question}], "max_tokens": 40, "temperature": 0,
            "conversation": conversation}).json()["choices"][0]["message"]["content"]
        deadline = time.monotonic() + 30
        while (title := http.get(f"/backend-api/conversation/{conversation}").json()["title"]) is None:
            assert time.monotonic() < deadline, "no title"
            time.sleep(0.1)
        assert_a_title(title, reply)
