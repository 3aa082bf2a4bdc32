"""One voice turn from headless Chromium to a real gateway; writes what it saw as JSON.

    python tests/e2e/browser_scenario.py --out result.json [--workdir DIR] [--chromium PATH]

Run by tests/e2e/test_browser.py, normally inside `unshare -rn` (a network namespace with only
loopback), so WebRTC can only pair 127.0.0.1 with 127.0.0.1. It does no assertions: it always
writes a result (with "failure" set when a step broke) and the test checks it.

Steps: start the gateway (models load meanwhile) and have Piper say the question into a 48 kHz
WAV; launch Chromium with that WAV as its fake microphone; open the page, press Start, and wait
until the page has a final transcript, assistant text, an audible assistant level (peak > 0.01)
and a latency entry with first audio; take a screenshot (page.png); type a request for a story in
the same call and press Interrupt 0.8 s into its audio (until the page hears silence); press Stop; collect `window.__gw`, timings and the gateway log's tail.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.voice_audio import Speaker, with_silence, write_wav  # noqa: E402
from benchmarks.voice_server import GatewayProcess  # noqa: E402

QUESTION = "What is the capital of France?"
WAV_RATE = 48000
LEAD_S = 1.5  # the page connects within about 1 s of opening the microphone
# Chromium loops the file. "%noloop" asks it not to, and the long tail keeps a second playing of
# the question far from the first answer should a Chromium ignore that suffix.
TRAIL_S = 20.0
ANSWER_TIMEOUT_S = 40.0
STORY = "Tell me a long story about a dragon."
INTERRUPT_AFTER_MS = 800

CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--use-fake-ui-for-media-stream",
    "--use-fake-device-for-media-stream",
    "--autoplay-policy=no-user-gesture-required",
    "--allow-loopback-in-peer-connection",
]

DONE_JS = """() => {
  const g = window.__gw;
  return !!g && g.transcripts.some((t) => /capital/i.test(t)) && g.assistantText.trim().length > 0
    && g.maxRemoteLevel > 0.01 && g.latency.some((l) => l.first_audio_ms !== null && l.first_audio_ms !== undefined);
}"""


def make_wav(path: Path) -> dict[str, Any]:
    speaker = Speaker()
    try:
        clip = with_silence(speaker.say(QUESTION, WAV_RATE), LEAD_S, TRAIL_S)
    finally:
        speaker.close()
    write_wav(path, clip.pcm, WAV_RATE)
    return {
        "speech_onset_s": round(clip.onset / WAV_RATE, 3),
        "speech_end_s": round(clip.end / WAV_RATE, 3),
        "duration_s": round(clip.duration_s, 2),
    }


def typed_turn_and_interrupt(page: Any) -> dict[str, Any]:
    """Type a request for a long answer in the same call, then press Interrupt while it plays."""
    from playwright.sync_api import Error as PlaywrightError

    out: dict[str, Any] = {"failure": None}
    events_before = page.evaluate("() => window.__gw.events.length")
    responses_before = page.evaluate("() => window.__gw.responses.length")
    page.fill("#sayInput", STORY)
    page.press("#sayInput", "Enter")
    try:
        page.wait_for_function(
            "n => window.__gw.events.slice(n).includes('output_audio_buffer.started') && window.__gw.remoteLevel > 0.01",
            arg=events_before,
            timeout=ANSWER_TIMEOUT_S * 1000,
            polling=50,
        )
        page.wait_for_timeout(INTERRUPT_AFTER_MS)
        clicked = page.evaluate("() => { document.querySelector('#interruptBtn').click(); return performance.now(); }")
        page.wait_for_function(
            "n => window.__gw.responses.length > n && window.__gw.remoteLevel < 0.003",
            arg=responses_before,
            timeout=10000,
            polling=20,
        )
        out["interrupt_to_silence_ms"] = round(page.evaluate("() => performance.now()") - clicked, 1)
        page.wait_for_function("n => window.__gw.responses.length > n", arg=responses_before, timeout=10000)
    except PlaywrightError as exc:
        out["failure"] = f"typed turn: {str(exc).splitlines()[0]}"
    state = page.evaluate(
        "n => ({responses: window.__gw.responses.slice(n), events: window.__gw.events, interrupts: window.__gw.interrupts})",
        responses_before,
    )
    out["interrupt"] = state["interrupts"][-1] if state["interrupts"] else None
    out["responses"] = state["responses"]
    out["events_after"] = state["events"][events_before:]
    out["typed_bubbles"] = page.locator(".msg.user .who", has_text="typed").count()
    out["interrupted_tags"] = page.locator(".msg.assistant .tag", has_text="interrupted").count()
    page.wait_for_timeout(300)
    out["error_banners"] = page.locator("#errors .error").all_inner_texts()
    return out


def run(args: argparse.Namespace) -> dict[str, Any]:
    from playwright.sync_api import Error as PlaywrightError
    from playwright.sync_api import sync_playwright

    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="gw-e2e-"))
    workdir.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {"failure": None, "timings_s": {}, "console": [], "page_errors": []}
    timings = result["timings_s"]
    t0 = time.monotonic()
    lap = lambda name: timings.__setitem__(name, round(time.monotonic() - t0, 3))  # noqa: E731
    gateway = GatewayProcess(workdir / "gateway.log").start()
    result["gateway_url"] = gateway.url
    ready: dict[str, Any] = {}

    def wait_ready() -> None:
        try:
            ready["health"] = gateway.wait_ready(args.ready_timeout)
        except Exception as exc:  # reported below
            ready["error"] = str(exc)

    waiter = threading.Thread(target=wait_ready, daemon=True)
    waiter.start()
    try:
        wav = workdir / "question.wav"
        result["wav"] = make_wav(wav)
        lap("wav_ready")
        waiter.join()
        if "error" in ready:
            result["failure"] = f"gateway: {ready['error']}"
            return result
        result["gateway_health"] = ready["health"]
        lap("gateway_ready")
        profile = workdir / "chromium-profile"
        shutil.rmtree(profile, ignore_errors=True)
        with sync_playwright() as playwright:
            context = playwright.chromium.launch_persistent_context(
                str(profile),
                executable_path=args.chromium,
                headless=True,
                args=[*CHROMIUM_FLAGS, f"--use-file-for-fake-audio-capture={wav}%noloop"],
                ignore_default_args=["--mute-audio"],
            )
            lap("browser_started")
            try:
                page = context.pages[0] if context.pages else context.new_page()
                page.on("console", lambda msg: result["console"].append(f"{msg.type}: {msg.text}"))
                page.on("pageerror", lambda exc: result["page_errors"].append(str(exc)))
                page.goto(gateway.url + "/", wait_until="load")
                lap("page_loaded")
                page.click("#startBtn")
                try:
                    page.wait_for_function("() => window.__gw && window.__gw.connected", timeout=15000, polling=50)
                    lap("connected")
                    page.wait_for_function(
                        "() => window.__gw.transcripts.length > 0", timeout=ANSWER_TIMEOUT_S * 1000, polling=50
                    )
                    lap("final_transcript")
                    page.wait_for_function(DONE_JS, timeout=ANSWER_TIMEOUT_S * 1000, polling=100)
                    lap("answer_heard_and_latency")
                except PlaywrightError as exc:
                    result["failure"] = f"page: {str(exc).splitlines()[0]}"
                result["page"] = page.evaluate("() => window.__gw")
                page.screenshot(path=str(workdir / "page.png"), full_page=True)
                if result["failure"] is None:
                    result["typed"] = typed_turn_and_interrupt(page)
                    lap("typed_turn_interrupted")
                result["status_text"] = page.inner_text("#status")
                result["latency_rows"] = page.locator("#latencyRows tr").count()
                result["error_banners"] = page.locator("#errors .error").all_inner_texts()
                page.click("#stopBtn")
                page.wait_for_function(
                    "() => !window.__gw.connected && document.querySelector('#startBtn').disabled === false",
                    timeout=5000,
                )
                result["after_stop"] = page.evaluate(
                    "() => ({connected: window.__gw.connected, state: window.__gw.state})"
                )
                lap("stopped")
            finally:
                context.close()
        time.sleep(0.3)  # the gateway logs the hang-up
    except Exception:
        result["failure"] = "scenario: " + traceback.format_exc(limit=5)
    finally:
        gateway.stop()
        result["gateway_log_tail"] = gateway.log_tail(80)
        lap("total")
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="where to write the JSON result")
    parser.add_argument("--workdir", help="WAV, browser profile and gateway log (default: a new temp dir)")
    parser.add_argument("--chromium", default=os.environ.get("CHROMIUM") or shutil.which("chromium"))
    parser.add_argument("--ready-timeout", type=float, default=120.0, help="seconds for the gateway's /healthz")
    args = parser.parse_args()
    result = run(args)
    result["network_namespace"] = os.environ.get("GW_E2E_IN_NETNS") == "1"
    Path(args.out).write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
