"""Browser tests: find Chromium, Firefox and Playwright. Missing ones skip locally and fail in CI (CI=true)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in {"1", "true", "yes"}


def _missing(message: str) -> None:
    if in_ci():
        pytest.fail(f"{message} (CI=true: a browser test may not be skipped)", pytrace=False)
    pytest.skip(message)


def _require_playwright() -> None:
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        _missing("the playwright Python package is not installed (pip install playwright; no `playwright install`)")


@pytest.fixture(scope="session")
def chromium_path() -> str:
    """Debian's chromium (or $CHROMIUM). Playwright's own browser download is never used."""
    path = os.environ.get("CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    if not path or not Path(path).exists():
        _missing("chromium not found: apt-get install -y chromium (or set CHROMIUM=/path/to/chromium)")
    _require_playwright()
    return str(path)


@pytest.fixture(scope="session")
def firefox_path() -> str:
    """Debian's firefox-esr (or $FIREFOX), plus the PulseAudio server and paplay that feed its microphone.

    Playwright drives it over WebDriver BiDi (channel "moz-firefox"); its own browser download is
    never used.
    """
    path = os.environ.get("FIREFOX") or shutil.which("firefox-esr") or shutil.which("firefox")
    if not path or not Path(path).exists():
        _missing("firefox not found: apt-get install -y firefox-esr (or set FIREFOX=/path/to/firefox)")
    missing = [tool for tool in ("pulseaudio", "paplay", "pactl") if not shutil.which(tool)]
    if missing:
        _missing(f"{', '.join(missing)} not found: apt-get install -y pulseaudio pulseaudio-utils")
    _require_playwright()
    return str(path)


@pytest.fixture(scope="session")
def netns_prefix() -> list[str]:
    """The command prefix that runs a command in a fresh network namespace with only loopback up.

    `unshare -rn` works as root and as an ordinary user where user namespaces are allowed. Where
    it does not work, or with GW_E2E_NETNS=0, the scenario runs in the host's network (it still
    offers only 127.0.0.1 from the gateway, but the browser may then try its other interfaces).
    """
    if os.environ.get("GW_E2E_NETNS", "1") == "0" or os.environ.get("GW_E2E_IN_NETNS") == "1":
        return []
    unshare, ip = shutil.which("unshare"), shutil.which("ip") or "/usr/sbin/ip"
    if not unshare or not Path(ip).exists():
        return []
    prefix = [unshare, "-rn", "sh", "-c", f'{ip} link set lo up && exec "$@"', "sh"]
    try:
        probe = subprocess.run([*prefix, "true"], capture_output=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return []
    return prefix if probe.returncode == 0 else []
