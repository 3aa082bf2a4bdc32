"""One voice turn from a headless browser (Chromium or Firefox) to a real gateway; writes what it saw as JSON.

    python tests/e2e/browser_scenario.py --out result.json [--browser chromium|firefox] [--executable PATH]
                                         [--workdir DIR]

Run by tests/e2e/test_browser.py, normally inside `unshare -rn` (a network namespace with only
loopback), so WebRTC can only pair 127.0.0.1 with 127.0.0.1. It does no assertions: it always
writes a result (with "failure" set when a step broke) and the test checks it.

Steps: start the gateway (models load meanwhile) and have Piper say the question into a 48 kHz
WAV; launch the browser with that WAV as its microphone; open the page, press Start, and wait
until the page has a final transcript, assistant text, an audible assistant level (peak > 0.01)
and a latency entry with first audio; take a screenshot (page.png); type a request for a story in
the same call and press Interrupt 0.8 s into its audio (until the page hears silence); press Stop;
collect `window.__gw`, timings, the ICE pairs the gateway checked and the gateway log's tail.

Only the launch and the microphone differ between the browsers; the page steps are shared:
- Chromium (Debian's) plays the WAV as its fake capture device (`--use-file-for-fake-audio-capture`).
- Firefox (Debian's firefox-esr, driven by Playwright over WebDriver BiDi, `channel="moz-firefox"`)
  has no such switch: its fake device only plays a tone. It uses its real PulseAudio input
  instead: the scenario starts a private PulseAudio server whose default source is the monitor of
  a null sink, and `paplay` plays the WAV into that sink once the page is connected. Firefox's
  own capture, audio processing, Opus encoder and peer connection carry it to the gateway, and
  its output goes to a second null sink (so the answer cannot leak into the microphone).
  Playwright's BiDi driver needs one command that Firefox ESR lacks, so Firefox runs behind
  tests/e2e/firefox_bidi_relay.py (see there).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.voice_audio import Speaker, with_silence, write_wav  # noqa: E402
from gateway.platform.processes import GatewayProcess  # noqa: E402

BROWSERS = ("chromium", "firefox")
RELAY = Path(__file__).with_name("firefox_bidi_relay.py")
QUESTION = "What is the capital of France?"
WAV_RATE = 48000
LEAD_S = 1.5  # Chromium's page connects within about 1 s of opening the microphone
# Chromium loops the file. "%noloop" asks it not to, and the long tail keeps a second playing of
# the question far from the first answer should a Chromium ignore that suffix. (Firefox's player
# is stopped with the call.)
TRAIL_S = 20.0
ANSWER_TIMEOUT_S = 40.0
STORY = "Tell me a long story about a dragon."
INTERRUPT_AFTER_MS = 800
ICE_PAIR = re.compile(
    r"CandidatePair\(\('([^']+)', \d+\) -> \('([^']+)', \d+\)\) State\.IN_PROGRESS -> State\.SUCCEEDED"
)

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

# On top of Playwright's own defaults for Firefox, which already point most background services
# (updates, telemetry, safe browsing, new tab feeds) at nothing. Autoplay keeps Firefox's default
# policy on purpose: the click on Start is the user gesture that lets the page play the answer.
FIREFOX_PREFS: dict[str, Any] = {
    "media.navigator.streams.fake": False,  # the real capture device: PulseAudio, see PulseMicrophone
    "media.navigator.permission.disabled": True,  # no permission prompt for the microphone
    "media.peerconnection.ice.loopback": True,  # offer 127.0.0.1 (the only interface in the namespace)
    "network.captive-portal-service.enabled": False,
    "app.normandy.enabled": False,
    "messaging-system.rsexperimentloader.enabled": False,
    "services.settings.server": "data:,#remote-settings-dummy/v1",
    "browser.ping-centre.telemetry": False,
    "toolkit.telemetry.server": "",
}

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


class PulseMicrophone:
    """A private PulseAudio server: its default source is the monitor of the null sink "mic".

    Whatever plays into "mic" (`play`) is what a client recording from the default source hears.
    The default sink is a second null sink, "speaker", so the browser's output stays out of the
    microphone. Anonymous clients are allowed on its socket; nothing touches the user's own server.
    """

    def __init__(self, directory: Path, log_path: Path) -> None:
        self.directory = directory  # short: a unix socket path has at most 107 bytes
        self.socket = directory / "native"
        self.log_path = log_path
        self.env = {"PULSE_SERVER": f"unix:{self.socket}", "PULSE_RUNTIME_PATH": str(directory / "runtime")}
        self.server: subprocess.Popen[bytes] | None = None
        self.player: subprocess.Popen[bytes] | None = None

    def start(self, timeout_s: float = 10.0) -> PulseMicrophone:
        script = self.directory / "default.pa"
        script.write_text(
            f"load-module module-native-protocol-unix auth-anonymous=1 socket={self.socket}\n"
            f"load-module module-null-sink sink_name=mic rate={WAV_RATE} channels=1 sink_properties=device.description=gw-e2e-mic\n"
            f"load-module module-null-sink sink_name=speaker rate={WAV_RATE} channels=2\n"
            "set-default-source mic.monitor\n"
            "set-default-sink speaker\n"
        )
        env = {**os.environ, **self.env, "HOME": str(self.directory), "PULSE_STATE_PATH": str(self.directory / "state")}
        command = ["pulseaudio", "-n", "-F", str(script), "--daemonize=no", "--exit-idle-time=-1"]
        command += ["--use-pid-file=no", "--disallow-exit", "--log-target=stderr"]
        with self.log_path.open("wb") as log:
            self.server = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout_s
        while not self.socket.exists():
            if self.server.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"pulseaudio did not start:\n{self.log_path.read_text(errors='replace')[-2000:]}")
            time.sleep(0.02)
        return self

    def play(self, wav: Path, timeout_s: float = 10.0) -> dict[str, Any]:
        """Start playing the WAV into "mic" once a client (the browser) records from a source, and say
        which sources it records from. The page can be connected before Firefox opens its PulseAudio
        stream: once that came more than the WAV's lead-in silence later, and the question's first
        words were lost."""
        started = time.monotonic()
        while not self._list("source-outputs") and time.monotonic() - started < timeout_s:
            time.sleep(0.05)
        waited = time.monotonic() - started
        command = ["paplay", "--device=mic", str(wav)]
        self.player = subprocess.Popen(command, env={**os.environ, **self.env}, stderr=subprocess.DEVNULL)
        names = {row[0]: row[1] for row in self._list("sources")}
        recording = [names.get(row[1], row[1]) for row in self._list("source-outputs")]
        return {"feed": "paplay into a PulseAudio null sink", "recording_from": recording,
                "waited_for_recording_s": round(waited, 2)}

    def _list(self, what: str) -> list[list[str]]:
        command = ["pactl", "list", "short", what]
        out = subprocess.run(command, env={**os.environ, **self.env}, capture_output=True, text=True, timeout=10)
        return [line.split("\t") for line in out.stdout.splitlines() if "\t" in line]

    def stop(self) -> None:
        for process in (self.player, self.server):
            if process is not None and process.poll() is None:
                process.terminate()
                try:
                    process.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()


# (browser context, "start speaking": called once the call is up, returns how the microphone is fed)
Launched = tuple[Any, Callable[[], dict[str, Any]]]


def launch_chromium(playwright: Any, args: argparse.Namespace, wav: Path, stack: contextlib.ExitStack) -> Launched:
    """Chromium's fake capture device plays the WAV from the moment the page opens the microphone."""
    profile = Path(args.workdir) / "chromium-profile"
    shutil.rmtree(profile, ignore_errors=True)
    context = playwright.chromium.launch_persistent_context(
        str(profile),
        executable_path=args.executable,
        headless=True,
        args=[*CHROMIUM_FLAGS, f"--use-file-for-fake-audio-capture={wav}%noloop"],
        ignore_default_args=["--mute-audio"],
    )
    stack.callback(context.close)
    return context, lambda: {"feed": "Chromium's fake capture device playing the WAV"}


def launch_firefox(playwright: Any, args: argparse.Namespace, wav: Path, stack: contextlib.ExitStack) -> Launched:
    """Firefox records from a private PulseAudio server; the WAV plays into it once the call is up."""
    workdir = Path(args.workdir)
    pulse_dir = Path(tempfile.mkdtemp(prefix="gw-pulse-"))
    stack.callback(shutil.rmtree, pulse_dir, ignore_errors=True)
    pulse = PulseMicrophone(pulse_dir, workdir / "pulseaudio.log")
    stack.callback(pulse.stop)
    pulse.start()
    wrapper = workdir / "firefox-relay.sh"
    quoted = " ".join(shlex.quote(str(part)) for part in (sys.executable, RELAY, args.executable))
    wrapper.write_text(f'#!/bin/sh\nexec {quoted} "$@"\n')
    wrapper.chmod(0o755)
    profile = workdir / "firefox-profile"
    shutil.rmtree(profile, ignore_errors=True)
    context = playwright.firefox.launch_persistent_context(
        str(profile),
        channel="moz-firefox",
        executable_path=str(wrapper),
        headless=True,
        env={**os.environ, **pulse.env},
        firefox_user_prefs=FIREFOX_PREFS,
    )
    stack.callback(context.close)
    return context, lambda: pulse.play(wav)


LAUNCHERS: dict[str, Callable[[Any, argparse.Namespace, Path, contextlib.ExitStack], Launched]] = {
    "chromium": launch_chromium,
    "firefox": launch_firefox,
}


def default_executable(browser: str) -> str | None:
    if browser == "chromium":
        return os.environ.get("CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    return os.environ.get("FIREFOX") or shutil.which("firefox-esr") or shutil.which("firefox")


def ice_pairs(log: str) -> list[list[str]]:
    """The (gateway, browser) addresses of each ICE check that succeeded, from aioice's log lines."""
    return [list(match) for match in ICE_PAIR.findall(log)]


def run(args: argparse.Namespace) -> dict[str, Any]:
    from playwright.sync_api import Error as PlaywrightError
    from playwright.sync_api import sync_playwright

    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="gw-e2e-"))
    workdir.mkdir(parents=True, exist_ok=True)
    args.workdir = str(workdir)
    result: dict[str, Any] = {
        "browser": args.browser,
        "failure": None,
        "timings_s": {},
        "console": [],
        "page_errors": [],
    }
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
        with sync_playwright() as playwright, contextlib.ExitStack() as stack:
            # The browser starts while the gateway loads its models.
            context, start_speaking = LAUNCHERS[args.browser](playwright, args, wav, stack)
            lap("browser_started")
            waiter.join()
            if "error" in ready:
                result["failure"] = f"gateway: {ready['error']}"
                return result
            result["gateway_health"] = ready["health"]
            lap("gateway_ready")
            page = context.pages[0] if context.pages else context.new_page()
            page.on("console", lambda msg: result["console"].append(f"{msg.type}: {msg.text}"))
            page.on("pageerror", lambda exc: result["page_errors"].append(str(exc)))
            page.goto(gateway.url + "/", wait_until="load")
            lap("page_loaded")
            result["user_agent"] = page.evaluate("() => navigator.userAgent")
            page.click("#startBtn")
            try:
                page.wait_for_function("() => window.__gw && window.__gw.connected", timeout=15000, polling=50)
                lap("connected")
                result["microphone"] = start_speaking()
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
            result["after_stop"] = page.evaluate("() => ({connected: window.__gw.connected, state: window.__gw.state})")
            lap("stopped")
        time.sleep(0.3)  # the gateway logs the hang-up
    except Exception:
        result["failure"] = "scenario: " + traceback.format_exc(limit=5)
    finally:
        gateway.stop()
        result["gateway_log_tail"] = gateway.log_tail(80)
        result["ice_pairs"] = ice_pairs(gateway.log_tail(100000))
        lap("total")
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="where to write the JSON result")
    parser.add_argument("--workdir", help="WAV, browser profile and gateway log (default: a new temp dir)")
    parser.add_argument("--browser", choices=BROWSERS, default="chromium")
    parser.add_argument("--executable", help="the browser (default: $CHROMIUM or chromium; $FIREFOX or firefox-esr)")
    parser.add_argument("--ready-timeout", type=float, default=300.0, help="seconds for the gateway's /healthz")
    args = parser.parse_args()
    # Terminated (the test timed out): unwind, so that the gateway, the browser and PulseAudio are stopped.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    args.executable = args.executable or default_executable(args.browser)
    result = run(args)
    result["network_namespace"] = os.environ.get("GW_E2E_IN_NETNS") == "1"
    Path(args.out).write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
