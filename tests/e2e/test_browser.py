"""Headless Chromium and Firefox speak to the real gateway over WebRTC, through the page at `/`.

Design: each browser's run (gateway subprocess + browser + Playwright) happens in one child
process, tests/e2e/browser_scenario.py, started inside `unshare -rn` when this test is not already
in a network namespace: a fresh namespace holds only `lo`, so ICE can only pair 127.0.0.1 with
127.0.0.1 and the result does not depend on the host's network cards (see TESTING.md). The
child writes what it saw as JSON; the assertions live here, with that JSON in their messages.
Both browsers get the same assertions.

    pytest -m browser tests/e2e/test_browser.py            # about 25-35 s per browser with cached models
    pytest -m browser tests/e2e/test_browser.py -k firefox # one browser
    GW_E2E_NETNS=0 pytest -m browser tests/e2e/...         # without the namespace

The microphone says "What is the capital of France?" (Piper, into a 48 kHz WAV with 1.5 s of
silence before it and 20 s after it):
- Chromium (Debian's `chromium`): its fake capture device plays the WAV, with Chromium's `%noloop`
  suffix. Should a Chromium build loop the file anyway, the long tail keeps the repeat far away:
  the call is stopped (Stop button) right after the first answer and the typed turn, about 10 s in.
- Firefox (Debian's `firefox-esr`, driven by Playwright over WebDriver BiDi): Firefox has no
  switch to play a file as its microphone (its fake device plays a tone), so it records with its
  real audio stack from a private PulseAudio server whose default source is a null sink's
  monitor, and `paplay` plays the WAV into that sink once the call is up. The page's own
  getUserMedia/RTCPeerConnection code runs unchanged; the test checks that Firefox recorded from
  that source. Firefox ESR runs behind tests/e2e/firefox_bidi_relay.py, which answers the one
  BiDi command Playwright sends that ESR does not know (a no-op media-feature override).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.browser

ROOT = Path(__file__).resolve().parents[2]
SCENARIO = Path(__file__).with_name("browser_scenario.py")
RUN_TIMEOUT_S = 420  # 300 s for a cold gateway start (a busy AVX2 host took 87 s to load its LLM), the rest for the call


def run_scenario(tmp_path: Path, browser: str, executable: str, netns_prefix: list[str]) -> dict[str, Any]:
    out = tmp_path / "result.json"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    if netns_prefix:
        env["GW_E2E_IN_NETNS"] = "1"
    command = [
        *netns_prefix,
        sys.executable,
        str(SCENARIO),
        "--out",
        str(out),
        "--workdir",
        str(tmp_path),
        "--browser",
        browser,
        "--executable",
        executable,
    ]
    # A process group of its own: on a timeout, everything it started (gateway, browser, PulseAudio)
    # goes with it. SIGTERM first, so that the scenario's own clean-up runs.
    proc = subprocess.Popen(
        command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        stdout, stderr = proc.communicate(timeout=RUN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            stdout, stderr = proc.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            stdout, stderr = proc.communicate()
        pytest.fail(f"the browser scenario timed out after {RUN_TIMEOUT_S} s:\n{stdout[-4000:]}\n{stderr[-4000:]}", pytrace=False)
    if proc.returncode != 0 or not out.exists():
        pytest.fail(
            f"the browser scenario crashed (exit {proc.returncode}):\n{stdout[-4000:]}\n{stderr[-4000:]}",
            pytrace=False,
        )
    return json.loads(out.read_text())


def describe(result: dict[str, Any]) -> str:
    """What the assertion messages show: enough to tell where the call broke."""
    page = result.get("page") or {}
    brief = {
        "failure": result.get("failure"),
        "browser": result.get("user_agent") or result.get("browser"),
        "microphone": result.get("microphone"),
        "ice_pairs": result.get("ice_pairs"),
        "network_namespace": result.get("network_namespace"),
        "timings_s": result.get("timings_s"),
        "status": result.get("status_text"),
        "event_counts": dict(Counter(page.get("events", []))),
        "transcripts": page.get("transcripts"),
        "partials": (page.get("partials") or [])[-3:],
        "assistantText": page.get("assistantText"),
        "latency": page.get("latency"),
        "maxRemoteLevel": page.get("maxRemoteLevel"),
        "maxMicLevel": page.get("maxMicLevel"),
        "rtp": page.get("rtp"),
        "page_errors": result.get("page_errors"),
        "error_banners": result.get("error_banners"),
    }
    return (
        json.dumps(brief, indent=1)
        + "\n--- gateway log (tail) ---\n"
        + "\n".join((result.get("gateway_log_tail") or "").splitlines()[-40:])
    )


@pytest.fixture(scope="module", params=["chromium", "firefox"])
def scenario(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, netns_prefix: list[str]
) -> dict[str, Any]:
    """One run of the scenario per browser (one gateway, one browser, one call) for both tests below."""
    browser = request.param
    executable = request.getfixturevalue(f"{browser}_path")
    return run_scenario(tmp_path_factory.mktemp(f"browser-{browser}"), browser, executable, netns_prefix)


def test_voice_turn(scenario: dict[str, Any]) -> None:
    result = scenario
    context = describe(result)
    print(context)
    page = result.get("page") or {}
    assert result.get("failure") is None, context
    assert page.get("connected") is not None, context
    assert result["ice_pairs"], "the gateway logged no successful ICE check\n" + context
    if result["browser"] == "firefox":
        # The question reached Firefox through PulseAudio, from the null sink paplay plays into.
        assert (result.get("microphone") or {}).get("recording_from") == ["mic.monitor"], context
    assert any("capital" in t.lower() for t in page["transcripts"]), "no final transcript with 'capital'\n" + context
    assert page["assistantText"].strip(), "no assistant text\n" + context
    assert page["maxRemoteLevel"] > 0.01, "the answer was not heard (remote peak level <= 0.01)\n" + context
    voiced = [entry for entry in page["latency"] if entry.get("first_audio_ms") is not None]
    assert voiced, "no latency entry with first audio\n" + context
    assert voiced[0]["kind"] == "voice" and voiced[0]["transcript_final_ms"] is not None, context
    assert result["latency_rows"] >= 1, "the latency panel stayed empty\n" + context
    assert not result["page_errors"], context
    assert not result["error_banners"], context
    assert result["after_stop"] == {"connected": False, "state": "Idle"}, context


def test_typed_turn_and_interrupt_button(scenario: dict[str, Any]) -> None:
    """In the same call: a typed request is answered aloud, and Interrupt silences it and cancels it."""
    typed = scenario.get("typed")
    if typed is None:
        pytest.fail("not run: the voice turn failed first\n" + describe(scenario), pytrace=False)
    context = (
        json.dumps({k: v for k, v in typed.items() if k != "events_after"}, indent=1)
        + "\nevents: "
        + json.dumps(dict(Counter(typed.get("events_after", []))))
    )
    assert typed["failure"] is None, context
    assert typed["typed_bubbles"] == 1, context
    statuses = [r["status"] for r in typed["responses"]]
    assert statuses and statuses[-1] == "cancelled", context
    assert typed["interrupted_tags"] >= 1, context
    assert "output_audio_buffer.cleared" in typed["events_after"], context
    assert typed["interrupt_to_silence_ms"] < 1000, context
    assert typed["interrupt"]["cleared_ms"] is not None and typed["interrupt"]["done_ms"] is not None, context
    assert not typed["error_banners"], context
