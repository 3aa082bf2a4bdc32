"""Which replica an id names: a call id, a GPT-Live session id or a resume token names the replica that holds it, and
a Realtime session id names none (gateway/api/forwarding.py)."""

from __future__ import annotations

import pytest

from gateway.api.forwarding import replica_of


@pytest.mark.parametrize(("identifier", "replica"), [
    ("rtc_r0_0123abcd", "r0"),
    ("sess_r1_0123abcd", "r1"),
    ("g2.c2VjcmV0LXRva2Vu", "g2"),
    ("sess_0123abcd", ""),  # a Realtime session's id
    ("rtc_0123abcd", ""),  # a call id from before replicas had names
    ("item_0123abcd", ""),
])
def test_an_id_names_the_replica_that_holds_it(identifier: str, replica: str) -> None:
    assert replica_of(identifier) == replica
