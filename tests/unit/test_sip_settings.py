"""The SIP trunk's options are refused at start when they do not hold together."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from gateway.platform.config import Settings
from tests.integration.sip_peers import self_signed_certificate

HOOKS = {"webhook_url": "http://127.0.0.1:9000/hooks", "webhook_secret": "whsec_c2VjcmV0"}


def test_a_trunk_with_its_webhook_is_taken() -> None:
    settings = Settings(sip_listen="127.0.0.1:5060", **HOOKS)
    assert settings.sip_allow == ["127.0.0.0/8", "::1/128"]  # loopback only until the carrier's networks are named


def test_tls_takes_a_certificate_and_its_key_only(tmp_path: Path) -> None:
    cert, key = self_signed_certificate(tmp_path)
    settings = Settings(sip_listen="127.0.0.1:5060", sip_tls_cert=cert, sip_tls_key=key, **HOOKS)
    assert settings.sip_tls_context() is not None
    (tmp_path / "other").mkdir()
    other_cert, _ = self_signed_certificate(tmp_path / "other")
    with pytest.raises(ValidationError, match="cannot be loaded"):
        Settings(sip_listen="127.0.0.1:5060", sip_tls_cert=other_cert, sip_tls_key=key, **HOOKS)  # another's key
    assert Settings(sip_listen="127.0.0.1:5060", sip_auth="trunk:pw:with:colons", **HOOKS).sip_passwords() == {
        "trunk": "pw:with:colons"}


@pytest.mark.parametrize(("options", "says"), [
    ({"sip_listen": "127.0.0.1"}, "host:port"),
    ({"sip_listen": "pbx.example:5060"}, "IP address"),
    ({"sip_listen": "0.0.0.0:5060"}, "--sip-advertise-ip"),
    ({"sip_listen": "127.0.0.1:5060", "webhook_url": None}, "--webhook-url"),
    ({"sip_listen": "127.0.0.1:5060", "webhook_secret": "plain"}, "whsec_"),
    ({"sip_listen": "127.0.0.1:5060", "sip_rtp_ports": "30000-20000"}, "--sip-rtp-ports"),
    ({"sip_listen": "127.0.0.1:5060", "sip_allow": "10.0.0.0/33"}, "10.0.0.0/33"),
    ({"sip_listen": "127.0.0.1:5060", "sip_auth": "trunk"}, "USER:PASSWORD"),
    ({"sip_listen": "127.0.0.1:5060", "sip_tls_cert": "cert.pem"}, "go together"),
    ({"sip_listen": "127.0.0.1:5060", "sip_tls_cert": "/nonexistent/cert.pem", "sip_tls_key": "/nonexistent/key.pem"},
     "cannot be loaded"),
])
def test_options_that_cannot_work_are_refused_by_name(options: dict[str, object], says: str) -> None:
    with pytest.raises(ValidationError) as refused:
        Settings(**{**HOOKS, **options})  # type: ignore[arg-type]
    assert says in str(refused.value)
