"""Each detector against text it must find and look-alikes it must leave alone."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.safety.detectors import (
    EMAIL,
    IBAN,
    PAYMENT_CARD,
    DenylistError,
    Detector,
    denylist_detector,
    iban_valid,
    load_denylist,
    luhn_valid,
    phone_detector,
    pii_detectors,
)

PHONE = phone_detector()  # the default region, US


def found(detector: Detector, text: str) -> list[str]:
    return [text[start:end] for start, end in detector.find(text)]


@pytest.mark.parametrize(("text", "expected"), [
    ("write to john.doe@example.com today", ["john.doe@example.com"]),
    ("<a.b+tag@mail.example.co.uk>", ["a.b+tag@mail.example.co.uk"]),
    ("ends with a dot: x_y@host.io.", ["x_y@host.io"]),
    ("not an address: john@localhost, @example.com, john@ and a@b.c", []),
])
def test_email(text: str, expected: list[str]) -> None:
    assert found(EMAIL, text) == expected


@pytest.mark.parametrize(("text", "expected"), [
    ("call (415) 555-0132 now", ["(415) 555-0132"]),
    ("or 415-555-0132.", ["415-555-0132"]),
    ("dotted 415.555.0132, spaced 1 800 555 0199", ["415.555.0132", "1 800 555 0199"]),
    ("US +1 415 555 0132 and +1 (415) 555-0132", ["+1 415 555 0132", "+1 (415) 555-0132"]),
    ("London +44 20 7946 0958 or +44 (0) 20 7946 0958", ["+44 20 7946 0958", "+44 (0) 20 7946 0958"]),
    ("E.164 +14155552671 too, tel:+1-212-555-0100", ["+14155552671", "+1-212-555-0100"]),
    ("Paris +33 1 42 68 53 00, Berlin +49 30 901820", ["+33 1 42 68 53 00", "+49 30 901820"]),
    ("the shortest: Niue +683 4002, St Helena +290 22345", ["+683 4002", "+290 22345"]),
    ("two: 415 555 0132 / 212 555 0100, (415) 555-0132 - 212-555-0100", [
        "415 555 0132", "212 555 0100", "(415) 555-0132", "212-555-0100"]),
    # Numbers, dates, decimals, times, ids: not phones.
    ("pi is 3.14159265358 and 1234567890 people", []),
    ("on 2026-11-25 at 12:30, order 12345", []),
    ("id msg_0193f2a01234abcd and uuid 0190a1b2-1234-5678-9012-3456789abcde", []),
    ("counting 10 11 12 13 14 15, years 2019 2020 2021 2022, back 20 19 18 17 16", []),
    ("on 12.05.2024 10.30 sharp", []),
    # Numbers that are not phones in the US (the default region) can be in another.
    ("Paris 01 42 68 53 00", []),
])
def test_phone(text: str, expected: list[str]) -> None:
    assert found(PHONE, text) == expected


def test_phone_region() -> None:
    assert found(phone_detector("FR"), "Paris 01 42 68 53 00 or +1 415 555 0132") == ["01 42 68 53 00",
                                                                                      "+1 415 555 0132"]
    assert found(phone_detector("GB"), "London 020 7946 0958") == ["020 7946 0958"]


# Ordinary text full of numbers (issue 28's reports among them): no rule may take any of it for personal data.
ORDINARY = """\
It costs $1,234,567.89, or 123 456 789 dollars, or € 1 299,00; a coffee is 3.50 and a flat 250 000 EUR.
The server is 192.168.100.200 (or 10.0.0.1:8080, or fe80::1), behind 203.0.113.45/24.
Versions: v2.14.3, Python 3.11.7, macOS 10.15.7, build 2024.01.15.1030, release 1.0.0-rc.2.
Dates and times: 2024-01-15 10:30, 15/01/2024, 01.15.2024 at 10:30:45.123, 2024-01-15T10:30:00Z, 12.05.2024 10.30.
Order #2024-0012-3344, invoice INV-2024-00123, ticket 88213, part 123-45-6789, account 00012345, ZIP 94103-1234.
Sequences: 2 4 6 8 10 12 14 16 18; 100 200 300 400 500; 1, 2, 3, 5, 8, 13, 21, 34, 55, 89; 10 11 12 13 14 15.
The world has 8 100 000 000 people; the Sun is 149 600 000 km away; light goes 299 792 458 m/s.
Measurements: 3.5 mm, 6 ft 2 in, 12 x 24 x 36 cm, 1 500 000 km, 37.7749, -122.4194, 98.6 F, 1013 hPa.
ISBN 978-3-16-148410-0; the score was 21-14, then 3-2-1; room 1204, flight BA 2490 at 18:45 from gate 32.
pi is 3.14159265358979, e is 2.718281828459045, and 2^32 is 4 294 967 296.
"""


def test_ordinary_numbers_are_not_personal_data() -> None:
    for detector in pii_detectors():
        assert found(detector, ORDINARY) == [], detector.name
    for line in ORDINARY.splitlines():  # each line alone, as a short message would come
        for detector in pii_detectors():
            assert found(detector, line) == [], (detector.name, line)


@pytest.mark.parametrize(("text", "expected"), [
    ("card 4111 1111 1111 1111 ok", ["4111 1111 1111 1111"]),
    ("amex 378282246310005.", ["378282246310005"]),
    ("dashed 5555-5555-5555-4444", ["5555-5555-5555-4444"]),
    ("bad checksum 4111 1111 1111 1112", []),
    ("too short 4111 1111 111", []),
    ("all zeros 0000 0000 0000 0000", []),
])
def test_payment_card(text: str, expected: list[str]) -> None:
    assert found(PAYMENT_CARD, text) == expected


def test_luhn() -> None:
    assert luhn_valid("79927398713") is False  # valid Luhn but 11 digits: no card is that short
    assert luhn_valid("4012888888881881")
    assert not luhn_valid("4012888888881882")


@pytest.mark.parametrize(("text", "expected"), [
    ("pay DE89 3704 0044 0532 0130 00 now", ["DE89 3704 0044 0532 0130 00"]),
    ("GB82WEST12345698765432", ["GB82WEST12345698765432"]),
    ("wrong check digits DE88 3704 0044 0532 0130 00", []),
    ("AB12 is not one, nor ISBN 9780306406157", []),
])
def test_iban(text: str, expected: list[str]) -> None:
    assert found(IBAN, text) == expected


def test_iban_checksum() -> None:
    assert iban_valid("FR14 2004 1010 0505 0001 3M02 606")
    assert not iban_valid("FR14 2004 1010 0505 0001 3M02 607")


def test_denylist_phrases_and_patterns(tmp_path: Path) -> None:
    path = tmp_path / "deny.txt"
    path.write_text("# comment\n\nsecret project\nre:launch\\s+codes?\n", encoding="utf-8")
    detector = load_denylist(path)
    assert detector is not None
    assert found(detector, "The SECRET   project and the launch codes.") == ["SECRET   project", "launch codes"]
    assert found(detector, "secretproject, a projected secret") == []


def test_denylist_errors(tmp_path: Path) -> None:
    assert denylist_detector(["# only a comment", "  "]) is None
    with pytest.raises(DenylistError, match="line 2"):
        denylist_detector(["fine", "re:(unclosed"])
    with pytest.raises(DenylistError, match="missing.txt"):
        load_denylist(tmp_path / "missing.txt")
