"""Streaming text to speakable chunks: LLM deltas in, sentences and early clauses out, for TTS.

Pure core. The first chunk of a response may end at a clause boundary so the first audio comes
early; later chunks end at sentences, or at a clause once the pending text is long.

The first chunk is also short when the reply has no early punctuation: past `first_chunk_max_words`
words it ends at a word boundary, before a phrase's first word where one is near ("... is the highest
| of the ..."). The user hears nothing until it is synthesized, and Piper's time grows with its length:
the embedded model's first sentences ran to 26 words (333 ms of Piper on 2 threads, against 81 ms for
6 words; Intel Xeon AVX512-VNNI, measured), and the LLM has to write all of them first. The rest of the
reply has the first chunk's playing time (2-3 s) to catch up.
"""

from __future__ import annotations

import re

_SENTENCE_PUNCT = ".!?…"
_CLOSERS = "\"')]}”’»"
_CLAUSE_PUNCT = ",;:"
_DASHES = "—–"
# Words whose trailing '.' does not end a sentence (compared lower-case, without the dot).
_ABBREVIATIONS = frozenset(
    "mr mrs ms dr prof sr jr st mt vs etc fig no vol approx dept est inc ltd co corp jan feb mar apr jun jul aug "
    "sep sept oct nov dec"
    .split()
)
# Words that open a phrase: a short first chunk ends before one of them rather than inside a phrase.
_PHRASE_STARTS = frozenset(
    "and or but so because which that who whom whose where when while with without within in on at of for to "
    "from by as than like about after before during if unless until into onto over under between through"
    .split()
)
_COMPLETE_WORD = re.compile(r"\S+(?=\s)")
_MARKDOWN = re.compile(r"[*#`_~]+")
_BULLET = re.compile(r"^\s*(?:[-•+>]\s+)+")
_SPACES = re.compile(r"\s+")


def clean_for_speech(text: str) -> str:
    """Drop markdown marks a voice would read aloud; '' when nothing speakable is left."""
    text = _BULLET.sub("", _MARKDOWN.sub("", text))
    text = _SPACES.sub(" ", text).strip()
    return text if any(ch.isalnum() for ch in text) else ""


class ClauseSplitter:
    def __init__(self, first_clause_words: int = 4, long_chars: int = 120, max_chars: int = 300,
                 first_chunk_max_words: int = 8) -> None:
        self.first_clause_words = first_clause_words  # words before a clause boundary may end the first chunk
        self.first_chunk_max_words = first_chunk_max_words  # a first chunk without punctuation ends by then
        self.long_chars = long_chars  # later chunks end at a clause boundary past this many characters
        self.max_chars = max_chars  # past this with no boundary at all, cut at the last space
        self.reset()

    def reset(self) -> None:
        self._pending = ""
        self._first = True

    def push(self, text_delta: str) -> list[str]:
        self._pending += text_delta
        out: list[str] = []
        while (cut := self._find_cut()) is not None:
            end, resume = cut
            self._emit(self._pending[:end], out)
            self._pending = self._pending[resume:].lstrip()
        return out

    def flush(self) -> list[str]:
        """The rest of the response; the splitter is then ready for a new one."""
        out: list[str] = []
        self._emit(self._pending, out)
        self.reset()
        return out

    def _emit(self, raw: str, out: list[str]) -> None:
        chunk = clean_for_speech(raw)
        if chunk:
            out.append(chunk)
            self._first = False

    def _find_cut(self) -> tuple[int, int] | None:
        """(end of chunk, where the rest starts), or None while the text so far decides nothing. The earlier of
        a boundary and a first chunk's word limit: the same cut however the text is split into deltas (a reply
        generated ahead and its replay must give the same first chunk)."""
        cut = self._boundary_cut()
        if self._first and (short := self._short_first_chunk(self._pending)) is not None:
            if cut is None or short[0] < cut[0]:
                return short
        return cut

    def _boundary_cut(self) -> tuple[int, int] | None:
        text = self._pending
        n = len(text)
        i = 0
        while i < n:
            ch = text[i]
            if ch == "\n":
                return i, i + 1
            if ch in _SENTENCE_PUNCT:
                j = i
                while j < n and (text[j] in _SENTENCE_PUNCT or text[j] in _CLOSERS):
                    j += 1
                if j == n:
                    return None  # "3." may become "3.14": wait for the next character
                if text[j].isspace() and not self._is_abbreviation(text, i, j):
                    return j, j
                i = j
                continue
            if (ch in _CLAUSE_PUNCT or ch in _DASHES) and self._clause_allowed(text[:i]):
                if i + 1 == n:
                    return None
                if ch in _DASHES or text[i + 1].isspace():
                    return i + 1, i + 1
            i += 1
        if n > self.max_chars:
            space = text.rfind(" ", 0, self.max_chars)
            # A run with no space at all (the small model's digits or symbols) is cut where it is, rather than held
            # to the reply's end: 256 such tokens kept a live reply silent for 8 s.
            return (space, space + 1) if space > 0 else (self.max_chars, self.max_chars)
        return None

    def _short_first_chunk(self, text: str) -> tuple[int, int] | None:
        """Where a first chunk with no boundary yet ends: once more than `first_chunk_max_words` words are complete,
        before the last phrase opener that leaves it `first_clause_words` words, else after the most words."""
        words = list(_COMPLETE_WORD.finditer(text))
        most = self.first_chunk_max_words
        if len(words) <= most:
            return None
        for k in range(most, self.first_clause_words - 1, -1):  # k: the first word of the next chunk
            if words[k].group().lower().strip("\"'([“‘") in _PHRASE_STARTS:
                return words[k - 1].end(), words[k].start()
        return words[most - 1].end(), words[most].start()

    def _clause_allowed(self, before: str) -> bool:
        if self._first:
            return len(before.split()) >= self.first_clause_words
        return len(before) >= self.long_chars

    def _is_abbreviation(self, text: str, punct_start: int, punct_end: int) -> bool:
        if text[punct_start:punct_end] != ".":
            return False  # "?", "!", "..." and "." with a closing quote end sentences
        word_start = max(text.rfind(" ", 0, punct_start), text.rfind("\n", 0, punct_start)) + 1
        word = text[word_start:punct_start].lstrip("(\"'“‘[")
        if not word:
            return False
        if word.isdigit():
            return word_start == 0 or not text[:word_start].strip()  # "1. " opening a list item
        if "." in word:
            return True  # e.g. i.e. U.S. a.m.
        if len(word) == 1 and word.isalpha() and word != "I":
            return True  # an initial: "J. Smith"
        return word.lower() in _ABBREVIATIONS
