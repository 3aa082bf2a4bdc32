"""The policy on whole texts and on streamed output: redaction, blocking, and how little is held back."""

from __future__ import annotations

import json

import pytest

from gateway.safety.detectors import denylist_detector, pii_detectors
from gateway.safety.policy import Rule, SafetyPolicy
from tests.unit.test_safety_detectors import ORDINARY

DENY = denylist_detector(["forbidden word"])
assert DENY is not None
POLICY = SafetyPolicy([Rule(DENY, "block"), *(Rule(d, "redact") for d in pii_detectors())])


def run(parts: list[str]) -> tuple[list[str], str | None]:
    stream = POLICY.stream()
    out = [stream.feed(part) for part in parts]
    out.append(stream.flush())
    return out, stream.blocked.rule if stream.blocked else None


def test_screen_redacts_and_blocks() -> None:
    screened = POLICY.screen("Mail me at jo@example.com or call +44 20 7946 0958.")
    assert screened.text == "Mail me at [email] or call [phone]."
    assert screened.blocked is None and screened.redacted
    blocked = POLICY.screen("say the Forbidden Word")
    assert blocked.blocked is not None and blocked.blocked.rule == "denylist"
    assert POLICY.screen("nothing here").findings == []


@pytest.mark.parametrize("split", range(1, 19))
def test_email_split_across_two_tokens(split: str) -> None:
    address = "jane.roe@example.org"
    text = f"Write to {address} soon"
    cut = len("Write to ") + split
    out, blocked = run([text[:cut], text[cut:]])
    assert "".join(out) == "Write to [email] soon"
    assert "@" not in "".join(out[:1]) and blocked is None


def test_card_split_across_tokens() -> None:
    out, _ = run(["Card 4111 1111", " 1111 1111", " thanks"])
    assert "".join(out) == "Card [payment_card] thanks"
    assert not any("4111" in part for part in out)


def test_holds_back_only_a_possible_match() -> None:
    out, _ = run(["The capital", " of France", " is Paris", " indeed."])
    # Each delta's words are released at once but its last word, which might still become an address.
    assert out == ["The ", "capital of ", "France is ", "Paris ", "indeed."]
    stream = POLICY.stream()
    stream.feed("x" * 1000)
    assert len(stream.held) <= 256  # never more than the longest match


def test_block_stops_the_stream() -> None:
    out, blocked = run(["All fine. Now the forb", "idden word", " and more"])
    assert blocked == "denylist"
    assert "".join(out) == "All fine. Now the "
    stream = POLICY.stream()
    stream.feed("forbidden word!")
    assert stream.blocked is not None and stream.feed("more") == "" and stream.flush() == ""


def test_a_match_at_the_end_waits_for_the_next_delta() -> None:
    stream = POLICY.stream()
    assert stream.feed("reach me at ann@example.com") == "reach me at "
    assert stream.feed(".au or not") == "[email] or "
    assert stream.flush() == "not"


def test_empty_policy_passes_everything() -> None:
    empty = SafetyPolicy([])
    assert not empty
    assert empty.screen("jo@example.com").text == "jo@example.com"


@pytest.mark.parametrize("size", [1, 3, 7, 100])
def test_labels_keep_a_json_reply_json(size: int) -> None:
    """In a reply constrained to JSON, a label inside a string stays as it is, and one that replaces a number
    (a card written as digits) is a string itself; escaped quotes do not end a string."""
    reply = ('{"note": "he said \\"card 4111 1111 1111 1111\\" and mail jo@example.com", "card": 4111111111111111, '
             '"n": 3}')
    stream = POLICY.stream(json_output=True)
    pieces = [stream.feed(reply[i:i + size]) for i in range(0, len(reply), size)]
    out = "".join(pieces) + stream.flush()
    assert json.loads(out) == {"note": 'he said "card [payment_card]" and mail [email]', "card": "[payment_card]",
                               "n": 3}
    plain = POLICY.stream()
    assert plain.feed(reply) + plain.flush() == out.replace('"[payment_card]", "n"', '[payment_card], "n"')


@pytest.mark.parametrize("split", range(1, 16))
def test_phone_split_across_two_tokens(split: int) -> None:
    text = "Call +1 415 555 0132 now"
    cut = len("Call ") + split
    out, _ = run([text[:cut], text[cut:]])
    assert "".join(out) == "Call [phone] now"
    assert not any("415" in part or "0132" in part for part in out)


@pytest.mark.parametrize("size", [1, 4, 50])
def test_ordinary_numbers_stream_through_unchanged(size: int) -> None:
    out, blocked = run([ORDINARY[i:i + size] for i in range(0, len(ORDINARY), size)])
    assert "".join(out) == ORDINARY and blocked is None
