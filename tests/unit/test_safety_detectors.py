"""Each detector against text it must find and look-alikes it must leave alone."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.safety.detectors import (
    EMAIL,
    IBAN,
    PAYMENT_CARD,
    PHONE,
    DenylistError,
    Detector,
    denylist_detector,
    iban_valid,
    load_denylist,
    luhn_valid,
)


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
    ("call (555) 123-4567 now", ["(555) 123-4567"]),
    ("or 555-123-4567.", ["555-123-4567"]),
    ("London +44 20 7946 0958", ["+44 20 7946 0958"]),
    ("E.164 +14155552671 too", ["+14155552671"]),
    ("Paris 01 42 68 53 00", ["01 42 68 53 00"]),
    # Numbers, dates, decimals, times, ids: not phones.
    ("pi is 3.14159265358 and 1234567890 people", []),
    ("on 2026-11-25 at 12:30, order 12345", []),
    ("id msg_0193f2a01234abcd and uuid 0190a1b2-1234-5678-9012-3456789abcde", []),
    ("counting 10 11 12 13 14 15, years 2019 2020 2021 2022, back 20 19 18 17 16", []),
    ("on 12.05.2024 10.30 sharp", []),
])
def test_phone(text: str, expected: list[str]) -> None:
    assert found(PHONE, text) == expected


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
