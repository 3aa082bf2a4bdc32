"""Grammar-constrained decoding with llguidance: which tokens a request may sample next.

One `GrammarCompiler` per loaded model wraps its tokenizer for llguidance (about 0.3 s once, so it is
built on first use). A request with a grammar gets its own `TokenConstraint`, whose mask the engine
applies to that request's row of logits only: the other rows of the batch are untouched. Grammars are
llguidance's Lark, with `%json {...}` for JSON schemas (`json_value`).
A mask costs 0.1-1.5 ms per token for the embedded model's 49152-token vocabulary (measured here).
"""

from __future__ import annotations

import json
import threading
from typing import Any

import numpy as np

_JSON = json.JSONDecoder()


class GrammarError(ValueError):
    """The grammar (or the schema it came from) cannot be compiled."""


class TokenConstraint:
    """One request's grammar state: the tokens allowed next, advanced by each sampled token."""

    def __init__(self, matcher: Any, vocab_size: int) -> None:
        self._matcher = matcher
        self._vocab_size = vocab_size

    def allowed(self) -> np.ndarray:
        """Boolean mask over the model's logits (ids past the tokenizer's vocabulary are never allowed)."""
        bits = np.unpackbits(np.frombuffer(self._matcher.compute_bitmask(), dtype=np.uint8), bitorder="little")
        mask = np.zeros(self._vocab_size, dtype=bool)
        n = min(self._vocab_size, bits.shape[0])
        mask[:n] = bits[:n].astype(bool)
        if not mask.any():
            raise GrammarError(f"the grammar allows no token: {self._matcher.get_error() or 'dead end'}")
        return mask

    def advance(self, token_id: int) -> None:
        if not self._matcher.consume_token(int(token_id)):
            raise GrammarError(f"token {token_id} breaks the grammar: {self._matcher.get_error()}")

    @property
    def finished(self) -> bool:
        """The grammar is complete: only the end of the sequence may follow."""
        return bool(self._matcher.is_stopped())


class GrammarCompiler:
    """llguidance over one model's tokenizer; thread-safe, built on first use."""

    def __init__(self, tokenizer: Any, vocab_size: int) -> None:
        self._tokenizer = tokenizer
        self._vocab_size = vocab_size
        self._ll_tokenizer: Any = None
        self._lock = threading.Lock()
        # A quoted literal that is one of the tokenizer's added tokens ("<tool_call>" in Qwen's, "<|im_end|>"):
        # llguidance matches such a token only by id (its text is not the token's bytes to it), and the model
        # writes the token, not the letters: the literal becomes the token, `<[id]>`.
        added = tokenizer.get_added_vocab() if hasattr(tokenizer, "get_added_vocab") else {}
        self._added_literals = {json.dumps(text): f"<[{token_id}]>" for text, token_id in added.items()
                                if len(text) > 2 and text.startswith("<") and text.endswith(">")}

    def _llg_tokenizer(self) -> Any:
        with self._lock:
            if self._ll_tokenizer is None:
                import llguidance.hf

                self._ll_tokenizer = llguidance.hf.from_tokenizer(self._tokenizer)
            return self._ll_tokenizer

    def constraint(self, grammar: str) -> TokenConstraint:
        """A fresh constraint for one request (blocking: up to ~1 s for huge schemas, so not on an event loop)."""
        from llguidance import LLMatcher

        matcher = LLMatcher(self._llg_tokenizer(), self.with_added_tokens(grammar), log_level=0)
        if matcher.is_error():
            raise GrammarError(matcher.get_error())
        return TokenConstraint(matcher, self._vocab_size)


    def with_added_tokens(self, grammar: str) -> str:
        """`grammar` with each quoted literal that is one added token written as that token (outside the JSON
        schemas of its `%json` parts, whose strings are the schemas' own)."""
        if not self._added_literals:
            return grammar
        parts, at = [], 0
        while (start := grammar.find("%json", at)) >= 0:
            parts.append(self._tokens_in(grammar[at:start]))
            body = start + len("%json")
            while body < len(grammar) and grammar[body].isspace():
                body += 1
            try:
                _, end = _JSON.raw_decode(grammar, body)
            except ValueError:  # not a JSON object after all: llguidance reports it
                end = body
            parts.append(grammar[start:end])
            at = end
        parts.append(self._tokens_in(grammar[at:]))
        return "".join(parts)

    def _tokens_in(self, lark: str) -> str:
        for literal, token in self._added_literals.items():
            lark = lark.replace(literal, token)
        return lark


# Compact, single-line JSON with the usual separators: flexible whitespace lets a small model pad forever.
JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


def json_value(schema: dict[str, Any]) -> str:
    """A Lark expression for the JSON documents that `schema` accepts (llguidance's `%json`)."""
    return "%json " + json.dumps({**schema, "x-guidance": JSON_OPTIONS}, ensure_ascii=True)


def json_schema_grammar(schema: dict[str, Any]) -> str:
    return f"start: {json_value(schema)}"
