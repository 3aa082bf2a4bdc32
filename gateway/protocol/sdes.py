"""SDES (RFC 4568): the SRTP keys of a SIP call, carried in its SDP's `a=crypto` lines.

The offer lists the suites the caller takes, each with the key it will send with; the answer picks one line (its
tag and suite) and gives the key the gateway sends with. Taken: AES_CM_128_HMAC_SHA1_80 and _32 (30 bytes of
master key and salt each), without MKI (one key for the whole call) and without session parameters, which would
change how the keys are used (UNENCRYPTED_SRTP, KDR, ...). A lifetime is taken as given: a call ends long before
2^31 packets.
"""

from __future__ import annotations

import base64
import binascii
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass

# Suite: pylibsrtp's profile name (Policy.SRTP_PROFILE_...), chosen in the caller's order.
SUITES = {"AES_CM_128_HMAC_SHA1_80": "SRTP_PROFILE_AES128_CM_SHA1_80",
          "AES_CM_128_HMAC_SHA1_32": "SRTP_PROFILE_AES128_CM_SHA1_32"}
KEY_SALT_BYTES = 30  # 128-bit master key, 112-bit master salt
_LINE = re.compile(r"^(\d{1,9})\s+(\S+)\s+inline:([A-Za-z0-9+/=]+)((?:\|[^|\s]+)*)\s*(.*)$")


@dataclass(frozen=True)
class SdesKeys:
    """One call's SRTP: the suite, the caller's key (for what it sends) and ours (for what we send)."""

    tag: str
    suite: str
    remote_key: bytes
    local_key: bytes

    @property
    def profile(self) -> str:
        return SUITES[self.suite]

    def answer_line(self) -> str:
        """The answer's `a=crypto` value."""
        return f"{self.tag} {self.suite} inline:{base64.b64encode(self.local_key).decode('ascii')}"


def choose(crypto_lines: Iterable[str]) -> SdesKeys | None:
    """The first offered line this side can take, with a fresh key of ours; None when there is none."""
    for line in crypto_lines:
        match = _LINE.match(line.strip())
        if match is None:
            continue
        tag, suite, key, key_params, session_params = match.groups()
        if suite not in SUITES or session_params or any(param.count(":") for param in key_params.split("|")[1:]):
            continue  # another suite, session parameters, or an MKI (LIFETIME|MKI:LENGTH: an MKI has a colon)
        try:
            remote_key = base64.b64decode(key, validate=True)
        except (binascii.Error, ValueError):
            continue
        if len(remote_key) != KEY_SALT_BYTES:
            continue
        return SdesKeys(tag, suite, remote_key, os.urandom(KEY_SALT_BYTES))
    return None
