"""What a Whisper decoder loop writes, told apart from speech: shared by the short-window decode (asr.py) and
the long-form fallback (whisper_fallback.py)."""

from __future__ import annotations

import re
import zlib

LOOP_COMPRESSION_RATIO = 2.4  # Whisper's own threshold for repetitive output


def repeats_a_sentence(text: str) -> bool:
    """The same sentence twice back to back: what a decoder loop writes."""
    sentences = [part.strip().lower() for part in re.split(r"[.?!]+", text) if part.strip()]
    return any(a == b for a, b in zip(sentences, sentences[1:]))


def looks_degenerate(text: str, tokens: int, budget: int) -> bool:
    """A decode that used its whole token budget, repeats a sentence back to back, or compresses like
    a repetition loop. (A user who really repeats a sentence only costs a decode over 30 s.)"""
    if tokens >= budget or repeats_a_sentence(text):
        return True
    data = text.encode()
    return len(data) > 24 and len(data) / len(zlib.compress(data)) > LOOP_COMPRESSION_RATIO
