"""The command line: options from flags and GATEWAY_* variables, and the refusal of an open public bind."""

from __future__ import annotations

import subprocess
import sys

import pytest

from gateway.cli import serve
from gateway.platform.config import Settings


def test_every_option_is_documented_in_help() -> None:
    result = subprocess.run([sys.executable, "-m", "gateway", "serve", "--help"], capture_output=True, text=True, check=True)
    for name in Settings.model_fields:
        assert f"--{name.replace('_', '-')}" in result.stdout


def test_environment_variables_set_options(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GATEWAY_PORT", "9123")
    monkeypatch.setenv("GATEWAY_API_KEYS", "sk-a, sk-b")
    monkeypatch.setenv("GATEWAY_ICE_HOST_ADDRESSES", "127.0.0.1")
    settings = Settings()
    assert settings.port == 9123
    assert settings.api_keys == ["sk-a", "sk-b"]
    assert settings.ice_host_addresses == ["127.0.0.1"]


def test_public_bind_without_a_key_is_refused() -> None:
    with pytest.raises(SystemExit, match="refusing to bind 0.0.0.0 with no API key"):
        serve(Settings(host="0.0.0.0"))


def test_phone_region_is_a_known_country() -> None:
    assert Settings(safety_phone_region="gb").safety_phone_region == "GB"
    refused = subprocess.run([sys.executable, "-m", "gateway", "serve", "--safety-phone-region", "ZZ"],
                             capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1 and "--safety-phone-region" in refused.stderr
