"""Which short-window Whisper outputs are decoded again over the full 30 s window."""

from __future__ import annotations

import pytest

from inference.asr import AsrEngine, looks_degenerate


@pytest.mark.parametrize(
    "text",
    [
        "What is the capital of France? What is the capital of France? What is the",
        "Hello, can you hear me? Hello, can you hear me?",
        "Hello? Hello? Hello? Hello? Hello? Hello? Hello? Hello? Hello? Hello?",
        "na na na na na na na na na na na na na na na na na na na na na na na na",
    ],
)
def test_repetition_loops_are_degenerate(text: str) -> None:
    assert looks_degenerate(text, tokens=20, budget=40)


@pytest.mark.parametrize(
    "text",
    [
        "What is the capital of France?",
        "Please book a table for four people at 730 tomorrow evening near the river.",
        "Wait, stop.",
        "Hello? Can you hear me?",
        "",
    ],
)
def test_ordinary_sentences_are_kept(text: str) -> None:
    assert not looks_degenerate(text, tokens=20, budget=40)


def test_a_decode_that_used_its_whole_budget_is_degenerate() -> None:
    assert looks_degenerate("What is the capital of", tokens=40, budget=40)


@pytest.mark.parametrize("window_s", [0.5, 31.0])
def test_window_outside_whispers_range_is_refused(window_s: float) -> None:
    with pytest.raises(ValueError, match="window_s"):
        AsrEngine(object(), language="en", final_beam_size=1, load_seconds=0.0, window_s=window_s)


@pytest.mark.parametrize("partial_window_s", [0.5, 31.0])
def test_partial_window_outside_whispers_range_is_refused(partial_window_s: float) -> None:
    with pytest.raises(ValueError, match="partial_window_s"):
        AsrEngine(object(), language="en", final_beam_size=1, load_seconds=0.0, partial_window_s=partial_window_s)


def test_a_partial_window_longer_than_the_finals_is_the_finals_and_partials_may_then_serve_as_finals() -> None:
    engine = AsrEngine(object(), language="en", final_beam_size=1, load_seconds=0.0, window_s=12.0, partial_window_s=20.0)
    try:
        assert engine.partial_window_s == 12.0 and engine.partials_serve_as_finals
    finally:
        engine.close()
