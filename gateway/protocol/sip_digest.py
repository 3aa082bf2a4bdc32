"""SIP digest authentication on the answering side (RFC 3261 §22, RFC 7616's qop=auth): the trunk's challenge and its
check of the caller's answer. The response itself is computed by aiosipua, the client side of the same exchange.

Nonces carry their own time and an HMAC of it under a key made at start, so nothing is stored per call: a nonce is
good for NONCE_LIFETIME_S, after which the caller is challenged again with `stale=true` (its password was right).
"""

from __future__ import annotations

import base64
import enum
import hashlib
import hmac
import os
import time

from aiosipua import SipDigestAuth
from aiosipua.auth import build_credentials
from aiosipua.headers import AuthChallenge, parse_auth

NONCE_LIFETIME_S = 300
ALGORITHMS = ("MD5", "SHA-256")  # what a caller may answer with (RFC 8760); the challenge offers MD5, which all take


class DigestVerdict(enum.Enum):
    """What an INVITE's Authorization header comes to."""

    MISSING = "missing"  # no credentials (or none for our realm): challenge it
    STALE = "stale"  # the right password on a nonce that has expired: challenge it again, stale=true
    WRONG = "wrong"  # an unknown user, a wrong password, a forged nonce or another URI: 403
    GOOD = "good"


class DigestAuthenticator:
    """Checks INVITEs against `users` (name: password) in `realm`."""

    def __init__(self, users: dict[str, str], realm: str) -> None:
        self._users = users
        self.realm = realm
        self._key = os.urandom(32)

    def challenge(self, *, stale: bool = False) -> str:
        """The WWW-Authenticate header of a 401."""
        issued = str(int(time.time()))
        nonce = f"{issued}.{self._sign(issued)}"
        value = f'Digest realm="{self.realm}", nonce="{nonce}", algorithm=MD5, qop="auth"'
        return value + (", stale=true" if stale else "")

    def verify(self, authorization: str | None, method: str) -> DigestVerdict:
        """The digest-uri is taken as the caller wrote it: callers differ (SIPp answers for the host alone, not the
        Request-URI), and the response binds it all the same."""
        if not authorization:
            return DigestVerdict.MISSING
        try:
            credentials = parse_auth(authorization, credentials=True)
        except (ValueError, IndexError):
            return DigestVerdict.WRONG
        params = credentials.params
        if credentials.scheme.lower() != "digest" or params.get("realm") != self.realm:
            return DigestVerdict.MISSING
        password = self._users.get(params.get("username", ""))
        nonce = params.get("nonce", "")
        issued, _, signature = nonce.partition(".")
        algorithm = params.get("algorithm", "MD5").upper()
        if password is None or algorithm not in ALGORITHMS or not issued.isdigit() \
                or not hmac.compare_digest(signature, self._sign(issued)):
            return DigestVerdict.WRONG
        qop = params.get("qop", "")
        nonce_count = params.get("nc", "1")
        if qop not in ("", "auth") or not all(c in "0123456789abcdefABCDEF" for c in nonce_count):
            return DigestVerdict.WRONG
        expected = build_credentials(
            SipDigestAuth(params["username"], password),
            AuthChallenge("Digest", {"realm": self.realm, "nonce": nonce, "algorithm": algorithm, "qop": qop}),
            method, params.get("uri", ""), nonce_count=int(nonce_count or "1", 16), cnonce=params.get("cnonce", ""))
        if expected is None or not hmac.compare_digest(expected.params["response"], params.get("response", "")):
            return DigestVerdict.WRONG
        if time.time() - int(issued) > NONCE_LIFETIME_S:
            return DigestVerdict.STALE
        return DigestVerdict.GOOD

    def _sign(self, issued: str) -> str:
        digest = hmac.new(self._key, issued.encode(), hashlib.sha256).digest()[:18]
        return base64.urlsafe_b64encode(digest).decode()
