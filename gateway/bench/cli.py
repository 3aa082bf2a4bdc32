"""The `bench` subcommand's options, and its one-line errors (never a traceback for bad input)."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field
from rich.console import Console

from gateway.bench.carriers import CARRIERS
from gateway.bench.clients import BenchError
from gateway.bench.ladder import parse_sessions
from gateway.bench.runner import QUESTIONS, BenchConfig, run, run_compare, run_ladder

DEFAULT_TURNS = 3
MAX_SESSIONS = 10_000


class Bench(BaseModel):
    """Measure latency against this gateway or any server with the same protocol; writes a report."""

    url: str | None = Field(None, description="The server, e.g. http://127.0.0.1:8000 (without /v1).")
    mode: Literal["chat", "text", "voice", "webrtc", "twilio", "telnyx", "plivo", "sip", "live"] = Field(
        "text", description="chat: Chat Completions SSE (any OpenAI-compatible server); text: Realtime WebSocket text "
        "turns; voice: Realtime WebSocket spoken turns at real-time pace, server VAD; webrtc: the same over a "
        "WebRTC call (SDP to /v1/realtime/calls, events on the oai-events data channel); twilio: the same as a phone "
        "call through Twilio Media Streams (/v1/telephony/twilio, 8 kHz mu-law; events on the call's sideband); telnyx, "
        "plivo: the same through Telnyx's or Plivo's media stream (/v1/telephony/telnyx, /plivo); sip: the same "
        "as a SIP call to the gateway's --sip-listen, the bench answering its webhook as the application (--sip, "
        "--webhook-listen, --webhook-secret); live: spoken turns over "
        "GPT-Live's WebSocket (/v1/live/sessions: the server's turn-taking, its audio paced; no server stages).")
    model: str = Field("smollm2-135m-instruct", description="The model to ask for.")
    api_key: str | None = Field(None, description="Bearer key, when the server needs one.")
    sessions: str = Field("4", description="Sessions (chat: conversations) run at once; several counts, as "
                          "1,2,4,8, run a capacity ladder: one run per count, in turn, each in --out/sessions-N/, "
                          "and ladder.json and ladder.png in --out (latency, stages, turns lost and the server's "
                          "core-seconds per turn, level by level).")
    turns: int | None = Field(None, ge=1, le=100_000, description=f"Turns per session (default {DEFAULT_TURNS}; "
                              "with --duration: no limit but the duration's).")
    ramp: float = Field(0.0, ge=0, description="Sessions started per second (0: all at once).")
    duration: float = Field(0.0, ge=0, description="Seconds after which no session or turn starts, turns under way "
                            "finishing (0: no limit); with --turns too, whichever comes first.")
    think_time: float = Field(0.0, ge=0, description="A session's pause between turns, drawn in [0, this] seconds.")
    prompt_file: Path | None = Field(None, description="Questions, one per line (default: a built-in list); in voice "
                                     "and webrtc modes the embedded Piper voice speaks them.")
    system_prompt_tokens: int = Field(0, ge=0, le=100_000,
                                      description="A shared system prompt of about this many tokens (the prefix cache).")
    max_tokens: int = Field(64, ge=1, description="Most tokens per answer.")
    seed: int | None = Field(None, description="Seeds each session's question order and think times (unset: 0) "
                             "and, in chat mode only, the server's sampling (the request's seed).")
    audio: Path | None = Field(None, description="--mode voice, webrtc, twilio, telnyx, plivo or sip: a folder of 16-bit WAV questions "
                                                  "(default: the questions spoken by the embedded Piper voice).")
    barge_in: bool = Field(False, description="--mode voice, webrtc, twilio, telnyx, plivo or sip: speak the next question over each answer "
                                              "and time how long the answer's audio goes on (barge_in_ms).")
    barge_in_after_ms: int = Field(300, ge=0, le=60_000,
                                   description="--barge-in: start speaking this long after the answer's first audio.")
    listen: bool = Field(False, description="--mode voice: each session listens to its answers, the next question "
                                            "once the answer's audio would have played out for a listener who "
                                            "played it from its first audio (--mode webrtc always does).")
    sip: str | None = Field(None, description="--mode sip: the gateway's --sip-listen, HOST:PORT (default: --url's "
                            "host, port 5060).")
    webhook_listen: str = Field("127.0.0.1:8787", description="--mode sip: where the bench takes the gateway's "
                                "webhooks as the application; the gateway's --webhook-url must point here.")
    webhook_secret: str | None = Field(None, description="--mode sip: the gateway's --webhook-secret (whsec_...), "
                                       "with which the bench checks each webhook.")
    out: Path = Field(Path("bench-out"), description="Where report.json, turns.csv, the plots and report.html go.")
    compare: list[Path] = Field(default_factory=list,
                                description="report.json files to print side by side (no run); compare.png goes to --out.")

    def cli_cmd(self) -> None:
        console = Console()
        try:
            if self.compare:
                if run_options := sorted(self.model_fields_set - {"compare", "out"}):
                    flags = ", ".join("--" + name.replace("_", "-") for name in run_options)
                    raise BenchError(f"--compare runs nothing: it takes only --out, not {flags}")
                run_compare(self.compare, self.out, console)
                return
            if not self.url:
                raise BenchError("--url is required (or --compare with report.json files)")
            if not self.url.startswith(("http://", "https://")):
                raise BenchError(f"--url must start with http:// or https://, not {self.url!r}")
            for option, given in (("--barge-in", self.barge_in), ("--audio", self.audio is not None)):
                if given and self.mode not in ("voice", "webrtc", *CARRIERS, "sip", "live"):
                    raise BenchError(f"{option} needs --mode voice, webrtc, twilio, telnyx, plivo, sip or live")
            for option in ("sip", "webhook_listen", "webhook_secret"):
                if option in self.model_fields_set and self.mode != "sip":
                    raise BenchError(f"--{option.replace('_', '-')} needs --mode sip")
            if self.listen and self.mode != "voice":
                raise BenchError("--listen needs --mode voice (--mode webrtc waits for each answer's playout anyway)")
            if "barge_in_after_ms" in self.model_fields_set and not self.barge_in:
                raise BenchError("--barge-in-after-ms needs --barge-in")
            if self.audio is not None and self.prompt_file is not None:
                raise BenchError("--audio gives the spoken questions: --prompt-file has no use with it")
            levels = parse_sessions(self.sessions)
            if any(level > MAX_SESSIONS for level in levels):
                raise BenchError(f"--sessions counts are at most {MAX_SESSIONS}")
            config = self._config(levels[0])
            asyncio.run(run(config, console) if len(levels) == 1 else run_ladder(config, levels, console))
        except (BenchError, ValueError) as exc:
            print(f"gateway bench: {exc}", file=sys.stderr)
            sys.exit(2)

    def _config(self, sessions: int) -> BenchConfig:
        prompts: tuple[str, ...] = QUESTIONS
        if self.prompt_file is not None:
            try:
                prompts = tuple(line.strip() for line in self.prompt_file.read_text().splitlines() if line.strip())
            except (OSError, UnicodeDecodeError) as exc:
                raise BenchError(f"cannot read --prompt-file {self.prompt_file}: {exc}") from None
            if not prompts:
                raise BenchError(f"--prompt-file {self.prompt_file} holds no question")
        return BenchConfig(url=self.url or "", mode=self.mode, model=self.model, api_key=self.api_key,
                           sessions=sessions, turns=self._turns(), ramp=self.ramp, duration=self.duration,
                           think_time=self.think_time, prompts=prompts, system_prompt_tokens=self.system_prompt_tokens,
                           max_tokens=self.max_tokens, seed=self.seed, out=self.out, audio=self.audio,
                           barge_in=self.barge_in, barge_in_after_ms=self.barge_in_after_ms, listen=self.listen,
                           sip=self.sip, webhook_listen=self.webhook_listen, webhook_secret=self.webhook_secret)

    def _turns(self) -> int | None:
        """Turns per session; None: as many as --duration allows."""
        if self.turns is not None:
            return self.turns
        return None if self.duration > 0 else DEFAULT_TURNS
