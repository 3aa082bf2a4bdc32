"""A request's text from its tokens, and why it ends (vLLM v1's output processor): each token is
detokenized without cutting a character in two, stop strings are cut (text that may begin one is held
back), and the request ends at an end-of-sequence token, a stop string or its token limit.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from .backend import FinishReason


class TextOutput:
    """One request's text, token by token: :meth:`accept` returns the text to send now and, on the token
    that ends the request, why (``stop``: an end-of-sequence token or a stop string; ``length``)."""

    __slots__ = ("detok", "stopper", "eos_ids", "max_new")

    def __init__(self, tokenizer, *, stop: Sequence[str], eos_ids: frozenset[int], max_new: int) -> None:
        self.detok = IncrementalDetokenizer(tokenizer)
        self.stopper = StopChecker(tuple(stop))
        self.eos_ids = eos_ids  # empty when the request ignores EOS
        self.max_new = max_new

    def accept(self, token: int, generated: int) -> tuple[str, FinishReason | None]:
        """``token``, the request's ``generated``-th."""
        if token in self.eos_ids:
            return self.stopper.feed(self.detok.flush())[0] + self.stopper.flush(), "stop"
        out, stopped = self.stopper.feed(self.detok.push(token))
        if stopped:
            return out, "stop"
        if generated >= self.max_new:
            tail, stopped = self.stopper.feed(self.detok.flush())
            return out + tail + ("" if stopped else self.stopper.flush()), "stop" if stopped else "length"
        return out, None


_RUST_DECODE: dict[type, bool] = {}


def _rust_decode(tokenizer):
    """``tokenizer``'s Rust decode where its ``decode(ids, skip_special_tokens=..., clean_up_tokenization_spaces=False)``
    is exactly that call (a transformers fast tokenizer whose class keeps the base ``_decode``), else None."""
    kind = type(tokenizer)
    if kind not in _RUST_DECODE:
        try:
            from tokenizers import Tokenizer
            from transformers import PreTrainedTokenizerFast
        except ImportError:  # pragma: no cover - both come with the engine
            _RUST_DECODE[kind] = False
        else:
            _RUST_DECODE[kind] = (issubclass(kind, PreTrainedTokenizerFast) and kind.decode is PreTrainedTokenizerFast.decode
                                  and kind._decode is PreTrainedTokenizerFast._decode
                                  and isinstance(getattr(tokenizer, "_tokenizer", None), Tokenizer))
    return tokenizer._tokenizer.decode if _RUST_DECODE[kind] else None


class IncrementalDetokenizer:
    """Turns a stream of token ids into text deltas without ever cutting a UTF-8 character in two.

    A delta is released only once the decoded text no longer ends in a replacement character (the
    start of a multi-byte character whose other bytes are in later tokens). Text is decoded from a
    short window of recent tokens, so each step costs O(1), not O(length): the window's released
    part's text is kept, so a token costs one decode (the window with it), and the window moves on
    past what was released once it holds more than ``WINDOW`` tokens, which costs one decode more of
    the part it keeps (every ``WINDOW`` tokens or so, fewer where a character spans tokens; before,
    every token cost two decodes).
    """

    WINDOW = 16

    __slots__ = ("tokenizer", "ids", "prefix_offset", "read_offset", "skip_special_tokens", "_prefix_text",
                 "_last_read", "_fast")

    def __init__(self, tokenizer, *, skip_special_tokens: bool = True) -> None:
        self.tokenizer = tokenizer
        # A transformers fast tokenizer's decode without cleanup is its Rust tokenizer's: called directly,
        # without transformers' Python around it (its checks of the ids cost 40 us of a 50 us decode).
        self._fast = _rust_decode(tokenizer)
        self.ids: list[int] = []
        self.prefix_offset = 0
        self.read_offset = 0
        self.skip_special_tokens = skip_special_tokens
        self._prefix_text = ""  # the text of ids[prefix_offset:read_offset]
        self._last_read = 0  # read_offset before the last delta was released

    def _decode(self, ids: Sequence[int]) -> str:
        if self._fast is not None:
            return self._fast(ids, skip_special_tokens=self.skip_special_tokens)
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens,
                                     clean_up_tokenization_spaces=False)

    def push(self, token_id: int) -> str:
        self.ids.append(int(token_id))
        new_text = self._decode(self.ids[self.prefix_offset :])
        prefix_text = self._prefix_text
        if len(new_text) > len(prefix_text) and not new_text.endswith("\ufffd"):
            delta = new_text[len(prefix_text) :]
            self._last_read, self.read_offset = self.read_offset, len(self.ids)
            if self.read_offset - self.prefix_offset > self.WINDOW:
                # Start the window at the last delta's tokens (their text decoded alone, as the window's
                # first tokens always are: a tokenizer may drop a leading space there).
                self.prefix_offset = self._last_read
                self._prefix_text = self._decode(self.ids[self.prefix_offset : self.read_offset])
            else:
                self._prefix_text = new_text
            return delta
        return ""

    def flush(self) -> str:
        """Whatever is still held back (an incomplete character at the very end), decoded as is."""
        prefix_text = self._prefix_text
        new_text = self._decode(self.ids[self.prefix_offset :])
        self.prefix_offset = self.read_offset = len(self.ids)
        self._prefix_text = ""
        if len(new_text) > len(prefix_text):
            return new_text[len(prefix_text) :].rstrip("\ufffd")
        return ""


@dataclass
class StopChecker:
    """Finds stop strings in generated text and holds back text that could be the start of one.

    ``feed(delta)`` returns (text safe to emit now, stopped). Once stopped, the stop string and
    everything after it are dropped; they are never emitted.
    """

    stops: tuple[str, ...] = ()
    text: str = ""        # all text generated so far (before any cut)
    emitted: int = 0      # characters of ``text`` already released
    stopped: bool = False
    _max_len: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        self.stops = tuple(s for s in self.stops if s)
        self._max_len = max((len(s) for s in self.stops), default=0)

    def feed(self, delta: str) -> tuple[str, bool]:
        if self.stopped:
            return "", True
        if not delta:
            return "", False
        self.text += delta
        if not self.stops:
            out = self.text[self.emitted :]
            self.emitted = len(self.text)
            return out, False
        # A stop string can only start at or after ``emitted`` (a possible start is always held back).
        search_from = self.emitted
        first = -1
        for s in self.stops:
            pos = self.text.find(s, search_from)
            if pos != -1 and (first == -1 or pos < first):
                first = pos
        if first != -1:
            out = self.text[self.emitted : first]
            self.emitted = first
            self.text = self.text[:first]
            self.stopped = True
            return out, True
        hold = self._held_back()
        end = len(self.text) - hold
        out = self.text[self.emitted : end]
        self.emitted = end
        return out, False

    def _held_back(self) -> int:
        """Length of the longest suffix of the unreleased text that is a proper prefix of a stop string."""
        tail = self.text[self.emitted :]
        best = 0
        for s in self.stops:
            for k in range(min(len(s) - 1, len(tail)), best, -1):
                if tail.endswith(s[:k]):
                    best = k
                    break
        return best

    def flush(self) -> str:
        """Release the held-back text (the generation ended without completing a stop string)."""
        if self.stopped:
            return ""
        out = self.text[self.emitted :]
        self.emitted = len(self.text)
        return out
