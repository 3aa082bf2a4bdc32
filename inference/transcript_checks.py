"""What a Whisper decoder loop writes, told apart from speech: shared by the short-window decode (asr.py) and
the long-form fallback (whisper_fallback.py)."""

from __future__ import annotations

import re
import zlib

LOOP_COMPRESSION_RATIO = 2.4  # Whisper's own threshold for repetitive output
# Whisper's average log-probability below which its words are a guess at sounds it cannot read. Calibrated with
# `python -m benchmarks.turn_taking` (tiny.en) on the voices other than the output voice (eight espeak-ng voices and
# speeds, two human recordings: 84 backchannels, 14 coughs, 105 interruptions), each utterance's decisions over a
# reply replayed under every threshold: with barge_in.py's command words, the fewest errors (2 of 203) lie in
# [-0.79, -0.68], and this is their middle; the margin is narrow (0.05). The output voice alone would put it anywhere
# in [-0.80, -0.60]. The end of a turn reads it too (session_config.turn_end_wait_ms).
LEAST_READABLE_LOGPROB = -0.74


def heard_surely(avg_logprob: float | None, least_readable: float = LEAST_READABLE_LOGPROB) -> bool:
    """Whether Whisper was sure of its words (`avg_logprob`: None when unknown, taken as sure)."""
    return avg_logprob is None or avg_logprob >= least_readable


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
