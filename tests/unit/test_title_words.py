"""The title's pure parts (gateway/generation/titles.py): the user's first words as a fallback, and which of the
model's titles are used."""

from __future__ import annotations

from gateway.generation.titles import first_words, usable


def test_first_words_keep_six_whole_words_up_to_the_first_sentences_end() -> None:
    assert first_words("Please tell me everything you know about the history of Rome.") == (
        "Please tell me everything you know")
    assert first_words("Hi there! Can you help me with my homework?") == "Hi there"
    assert first_words("  What is\nthe capital   of France?  ") == "What is the capital of France"
    assert first_words("Supercalifragilisticexpialidocious") == "Supercalifragilisticexpialidocious"
    assert first_words("?!") is None and first_words("   ") is None


def test_a_model_title_is_used_only_when_the_model_ended_it_within_six_whole_words() -> None:
    assert usable("Capital Of France", "stop")
    assert not usable("Capital Of France", "length")  # cut by max_tokens: its last word may be half
    assert not usable("The Tallest Volcano In Europe Is Mount", "stop")  # a seventh word: a sentence
    assert not usable("I Can Help You Write Acoverletterforanurse", "stop")  # a word at the bound: glued or cut
    assert not usable("", "stop")
