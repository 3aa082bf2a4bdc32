"""What the safety policy looks for: personal data (e-mail, phone, payment card, IBAN) and a denylist.

Each detector is one `regex` pattern (the `regex` module, for partial matches: see policy.StreamFilter) that
finds candidates, and optionally a check of a candidate (Luhn for cards, ISO 7064 mod 97 for IBANs) that rejects
look-alikes, or a locator of the matches inside it: phone numbers are whatever the `phonenumbers` library (Google's
libphonenumber metadata) finds in a run of digits and separators, so that prices, IPs, dates, times, order numbers
and sequences are left alone.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import phonenumbers
import regex

from gateway.platform.config import DEFAULT_PHONE_REGION

# The longest text any one match may span, and so the most a streamed reply is held back for it.
MAX_MATCH_CHARS = 256

Span = tuple[int, int]


@dataclass(frozen=True)
class Detector:
    name: str  # also the redaction label: "[email]"
    pattern: regex.Pattern[str]  # the candidates; a partial one holds a stream back
    check: Callable[[str], bool] | None = None  # a candidate is a match when it passes
    locate: Callable[[str], Iterable[Span]] | None = None  # instead: the matches inside a candidate

    def spans(self, candidate: str) -> Iterable[Span]:
        """The matches in one candidate, at its own offsets."""
        if self.locate is not None:
            return self.locate(candidate)
        return [(0, len(candidate))] if self.check is None or self.check(candidate) else []

    def find(self, text: str) -> Iterator[Span]:
        """The spans of `text` this detector reports (complete text: nothing more follows)."""
        for match in self.pattern.finditer(text):
            for start, end in self.spans(match.group()):
                yield match.start() + start, match.start() + end

    @property
    def label(self) -> str:
        return f"[{self.name}]"


def _digits(text: str) -> str:
    return "".join(ch for ch in text if ch.isdigit())


def luhn_valid(text: str) -> bool:
    digits = _digits(text)
    if not 13 <= len(digits) <= 19 or len(set(digits)) == 1:
        return False
    total = 0
    for index, ch in enumerate(reversed(digits)):
        value = int(ch)
        if index % 2 == 1:
            value = value * 2 - 9 if value > 4 else value * 2
        total += value
    return total % 10 == 0


def iban_valid(text: str) -> bool:
    compact = text.replace(" ", "").upper()
    if not 15 <= len(compact) <= 34:
        return False
    moved = compact[4:] + compact[:4]
    return int("".join(str(int(ch, 36)) for ch in moved)) % 97 == 1


EMAIL = Detector("email", regex.compile(
    r"(?<![\w.%+-])[A-Za-z0-9][A-Za-z0-9._%+-]{0,63}@[A-Za-z0-9](?:[A-Za-z0-9-]{0,62})"
    r"(?:\.[A-Za-z0-9-]{1,63}){0,6}\.[A-Za-z]{2,24}(?![\w-])"))
PAYMENT_CARD = Detector("payment_card", regex.compile(r"(?<![\w-])\d(?:[ -]?\d){12,18}(?![\w-])"), luhn_valid)
IBAN = Detector("iban", regex.compile(r"(?<![\w])[A-Z]{2}\d{2}(?: ?[A-Z0-9]){11,30}(?![\w])"), iban_valid)

# A run of digits and the separators phone numbers are written with; libphonenumber finds the numbers in it.
# Not inside a word or a dash-, dot- or slash-joined run (a UUID, a version, a path). It may end in a separator,
# so that a stream holds "+1 " back for the digits that may follow.
_PHONE_CANDIDATE = regex.compile(r"(?<![\w+.,/-])\+?\(?\d[\d().\-/ \t]{0,250}(?!\w)")
MIN_PHONE_DIGITS = 7  # the shortest numbers anywhere, with their country code (Niue's +683 4002)


def phone_detector(region: str = DEFAULT_PHONE_REGION) -> Detector:
    """Numbers libphonenumber deems valid and grouped as that country writes them (STRICT_GROUPING: not "20 19 18
    17 16", which is a valid number grouped as no one dials it), never the digits after a decimal point."""
    def locate(candidate: str) -> Iterator[Span]:
        if sum(ch.isdigit() for ch in candidate) < MIN_PHONE_DIGITS:  # most numbers in text: skip the matcher
            return
        for match in phonenumbers.PhoneNumberMatcher(candidate, region, leniency=phonenumbers.Leniency.STRICT_GROUPING):
            if not _inside_a_decimal(candidate, match.start, match.end):
                yield match.start, match.end

    return Detector("phone", _PHONE_CANDIDATE, locate=locate)


def _inside_a_decimal(text: str, start: int, end: int) -> bool:
    """The digits after the point of 3.14159265358 (libphonenumber reads 14159265358), or before one."""
    before = text[max(0, start - 2):start]
    after = text[end:end + 2]
    return (len(before) == 2 and before[1] in ".," and before[0].isdigit()) or (
        len(after) == 2 and after[0] in ".," and after[1].isdigit())


def pii_detectors(phone_region: str = DEFAULT_PHONE_REGION) -> tuple[Detector, ...]:
    return EMAIL, PAYMENT_CARD, IBAN, phone_detector(phone_region)


class DenylistError(ValueError):
    """A denylist file that cannot be used (unreadable, or a bad pattern): refused at start."""


def denylist_detector(lines: Sequence[str], name: str = "denylist") -> Detector | None:
    """One detector for a denylist: a line per entry, a phrase matched as whole words, case-insensitively,
    or `re:` and a regular expression; blank lines and `#` comments are skipped. None when it is empty."""
    parts = []
    for number, raw in enumerate(lines, 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("re:"):
            try:
                regex.compile(line[3:])
            except regex.error as exc:
                raise DenylistError(f"line {number}: {exc}") from None
            parts.append(f"(?:{line[3:]})")
        else:
            words = r"\s+".join(regex.escape(word) for word in line.split())
            parts.append(rf"(?<!\w){words}(?!\w)")
    if not parts:
        return None
    return Detector(name, regex.compile("|".join(parts), regex.IGNORECASE))


def load_denylist(path: Path) -> Detector | None:
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise DenylistError(f"{path}: {exc}") from None
    try:
        return denylist_detector(lines)
    except DenylistError as exc:
        raise DenylistError(f"{path}, {exc}") from None
