"""The SIP trunk's digest check (--sip-auth): answers computed here by RFC 7616's formula, not by the code checked."""

from __future__ import annotations

import hashlib
import re

import pytest

from gateway.protocol import sip_digest
from gateway.protocol.sip_digest import DigestAuthenticator, DigestVerdict

URI = "sip:assistant@127.0.0.1:5060"


def answer(challenge: str, user: str, password: str, *, algorithm: str = "MD5",
           realm: str | None = None, qop: bool = True) -> str:
    params = dict(re.findall(r'(\w+)="?([^",]+)"?', challenge.removeprefix("Digest ")))
    realm = realm or params["realm"]

    def h(text: str) -> str:
        return hashlib.new("md5" if algorithm == "MD5" else "sha256", text.encode()).hexdigest()

    ha1, ha2 = h(f"{user}:{realm}:{password}"), h(f"INVITE:{URI}")
    if qop:
        response = h(f"{ha1}:{params['nonce']}:00000001:0a4f113b:auth:{ha2}")
        extra = ', qop=auth, nc=00000001, cnonce="0a4f113b"'
    else:
        response, extra = h(f"{ha1}:{params['nonce']}:{ha2}"), ""
    return (f'Digest username="{user}", realm="{realm}", nonce="{params["nonce"]}", uri="{URI}", '
            f'response="{response}", algorithm={algorithm}{extra}')


@pytest.fixture
def digest() -> DigestAuthenticator:
    return DigestAuthenticator({"trunk": "s3cret"}, "gateway")


def test_the_right_answer_passes_with_either_algorithm_and_with_or_without_qop(digest: DigestAuthenticator) -> None:
    challenge = digest.challenge()
    assert 'realm="gateway"' in challenge and 'qop="auth"' in challenge and "stale" not in challenge
    assert digest.verify(answer(challenge, "trunk", "s3cret"), "INVITE") is DigestVerdict.GOOD
    assert digest.verify(answer(challenge, "trunk", "s3cret", algorithm="SHA-256"), "INVITE") is DigestVerdict.GOOD
    assert digest.verify(answer(challenge, "trunk", "s3cret", qop=False), "INVITE") is DigestVerdict.GOOD


def test_wrong_answers_are_refused(digest: DigestAuthenticator) -> None:
    challenge = digest.challenge()
    assert digest.verify(answer(challenge, "trunk", "guess"), "INVITE") is DigestVerdict.WRONG
    assert digest.verify(answer(challenge, "someone", "s3cret"), "INVITE") is DigestVerdict.WRONG
    # The URI or the method changed after answering.
    tampered = answer(challenge, "trunk", "s3cret").replace(URI, "sip:other@example.com")
    assert digest.verify(tampered, "INVITE") is DigestVerdict.WRONG
    assert digest.verify(answer(challenge, "trunk", "s3cret"), "BYE") is DigestVerdict.WRONG
    # A nonce the gateway did not issue: one of another gateway's, or made up.
    other = DigestAuthenticator({"trunk": "s3cret"}, "gateway").challenge()
    assert digest.verify(answer(other, "trunk", "s3cret"), "INVITE") is DigestVerdict.WRONG
    forged = re.sub(r'nonce="(\d+)\.', 'nonce="1.', challenge)
    assert digest.verify(answer(forged, "trunk", "s3cret"), "INVITE") is DigestVerdict.WRONG
    assert digest.verify('Digest realm="gateway", nonce=","', "INVITE") is DigestVerdict.WRONG
    assert digest.verify(answer(challenge, "trunk", "s3cret", algorithm="MD5-sess"), "INVITE") is DigestVerdict.WRONG


def test_no_answer_or_another_realm_is_challenged(digest: DigestAuthenticator) -> None:
    assert digest.verify(None, "INVITE") is DigestVerdict.MISSING
    assert digest.verify('Basic dHJ1bms6czNjcmV0', "INVITE") is DigestVerdict.MISSING
    challenge = digest.challenge()
    assert digest.verify(answer(challenge, "trunk", "s3cret", realm="carrier"), "INVITE") is DigestVerdict.MISSING


def test_an_old_nonce_is_stale_with_the_right_password_only(digest: DigestAuthenticator,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    challenge = digest.challenge()
    issued = sip_digest.time.time()
    monkeypatch.setattr(sip_digest.time, "time", lambda: issued + sip_digest.NONCE_LIFETIME_S + 1)
    assert digest.verify(answer(challenge, "trunk", "s3cret"), "INVITE") is DigestVerdict.STALE
    assert digest.verify(answer(challenge, "trunk", "guess"), "INVITE") is DigestVerdict.WRONG
    assert digest.challenge(stale=True).endswith(", stale=true")
