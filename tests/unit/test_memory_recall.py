"""What memory saves from a message, and which memories bear on a question."""

from __future__ import annotations

import pytest

from gateway.generation.memory import Recall, fact_to_remember, relevant
from gateway.platform.storage.schema import MemoryRow


@pytest.mark.parametrize(("text", "fact"), [
    ("Remember that my dog is called Rex.", "my dog is called Rex"),
    ("please remember: I take my coffee black!", "I take my coffee black"),
    ("Don't forget my sister's birthday is in May", "my sister's birthday is in May"),
    ("Do you remember my dog?", None),
    ("I remember that day.", None),
    ("remember", None),
])
def test_fact_to_remember(text: str, fact: str | None) -> None:
    assert fact_to_remember(text) == fact


def row(memory_id: str, content: str) -> MemoryRow:
    return MemoryRow(id=memory_id, owner="key_x", content=content, created_at=0.0)


def test_relevant_memories_share_words_with_the_question() -> None:
    dog, coffee, dog_vet = row("mem_1", "my dog is called Rex"), row("mem_2", "I take my coffee black"), \
        row("mem_3", "the dog's vet is Dr Lee")
    assert relevant([dog, coffee, dog_vet], "What is my dog called?") == [dog, dog_vet]
    assert relevant([dog, coffee], "How do I like my coffee?") == [coffee]
    assert relevant([dog, coffee], "What is the capital of France?") == []
    same = [row(f"mem_{i}", "dog") for i in range(5)]
    assert [m.id for m in relevant(same, "dog", limit=3)] == ["mem_4", "mem_3", "mem_2"]  # newest first among equals


def test_recall_metadata_and_instructions() -> None:
    recall = Recall(used=[row("mem_1", "my dog is called Rex")], saved=[row("mem_2", "x")])
    assert recall.metadata() == {"memories_used": "mem_1", "memories_saved": "mem_2"}
    assert recall.instructions is not None and "- my dog is called Rex" in recall.instructions
    assert Recall().instructions is None
