"""The SIP trunk's options are refused at start when they do not hold together."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from gateway.platform.config import Settings

HOOKS = {"webhook_url": "http://127.0.0.1:9000/hooks", "webhook_secret": "whsec_c2VjcmV0"}


def test_a_trunk_with_its_webhook_is_taken() -> None:
    settings = Settings(sip_listen="127.0.0.1:5060", **HOOKS)
    assert settings.sip_allow == ["127.0.0.0/8", "::1/128"]  # loopback only until the carrier's networks are named


@pytest.mark.parametrize(("options", "says"), [
    ({"sip_listen": "127.0.0.1"}, "host:port"),
    ({"sip_listen": "pbx.example:5060"}, "IP address"),
    ({"sip_listen": "0.0.0.0:5060"}, "--sip-advertise-ip"),
    ({"sip_listen": "127.0.0.1:5060", "webhook_url": None}, "--webhook-url"),
    ({"sip_listen": "127.0.0.1:5060", "webhook_secret": "plain"}, "whsec_"),
    ({"sip_listen": "127.0.0.1:5060", "sip_rtp_ports": "30000-20000"}, "--sip-rtp-ports"),
    ({"sip_listen": "127.0.0.1:5060", "sip_allow": "10.0.0.0/33"}, "10.0.0.0/33"),
])
def test_options_that_cannot_work_are_refused_by_name(options: dict[str, object], says: str) -> None:
    with pytest.raises(ValidationError) as refused:
        Settings(**{**HOOKS, **options})  # type: ignore[arg-type]
    assert says in str(refused.value)
