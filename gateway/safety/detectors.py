"""What the safety policy looks for: personal data (e-mail, phone, payment card, IBAN) and a denylist.

Each detector is one `regex` pattern (the `regex` module, for partial matches: see stream_filter.py) and an
optional check of the matched text (Luhn for cards, ISO 7064 mod 97 for IBANs, a digit count for phones), so
that the pattern finds candidates and the check rejects look-alikes (an order number, a date, a decimal).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import regex

# The longest text any one match may span, and so the most a streamed reply is held back for it.
MAX_MATCH_CHARS = 256


@dataclass(frozen=True)
class Detector:
    name: str  # also the redaction label: "[email]"
    pattern: regex.Pattern[str]
    check: Callable[[str], bool] | None = None

    def valid(self, text: str) -> bool:
        return self.check is None or self.check(text)

    def find(self, text: str) -> Iterator[tuple[int, int]]:
        """The spans of `text` this detector reports (complete text: nothing more follows)."""
        for match in self.pattern.finditer(text):
            if self.valid(match.group()):
                yield match.span()

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


def phone_valid(text: str) -> bool:
    """9 to 15 digits (E.164), written as a phone number: with a leading +, or in groups. Not a phone: a bare run
    of digits, one with a single dot (a decimal), dots beside other separators (a date and a time), or groups
    that count up or down by one (counting "10 11 12 13 14", a list of years)."""
    digits = _digits(text)
    if not 9 <= len(digits) <= 15:
        return False
    if text.startswith("+"):
        return True
    separators = [ch for ch in text if not ch.isdigit() and ch not in "()"]
    if "." in separators and len(set(separators)) > 1:
        return False
    groups = [int(group) for group in regex.findall(r"\d+", text)]
    steps = {later - earlier for earlier, later in zip(groups, groups[1:], strict=False)}
    if len(groups) > 2 and steps in ({1}, {-1}):
        return False
    return len(separators) > 1 or separators == [" "] or separators == ["-"]


EMAIL = Detector("email", regex.compile(
    r"(?<![\w.%+-])[A-Za-z0-9][A-Za-z0-9._%+-]{0,63}@[A-Za-z0-9](?:[A-Za-z0-9-]{0,62})"
    r"(?:\.[A-Za-z0-9-]{1,63}){0,6}\.[A-Za-z]{2,24}(?![\w-])"))
# Not inside a word, nor a dash-joined run such as a UUID ("...-1234-5678-9012-...").
PHONE = Detector("phone", regex.compile(
    r"(?<![\w+-])(?:\+\d{1,3}[ .-]?)?(?:\(\d{1,4}\)[ .-]?)?\d{2,5}(?:[ .-]\d{2,5}){1,4}(?![\w-])"
    r"|(?<![\w+-])\+\d{8,15}(?![\w-])"), phone_valid)
PAYMENT_CARD = Detector("payment_card", regex.compile(r"(?<![\w-])\d(?:[ -]?\d){12,18}(?![\w-])"), luhn_valid)
IBAN = Detector("iban", regex.compile(r"(?<![\w])[A-Z]{2}\d{2}(?: ?[A-Z0-9]){11,30}(?![\w])"), iban_valid)

PII_DETECTORS: tuple[Detector, ...] = (EMAIL, PAYMENT_CARD, IBAN, PHONE)


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
