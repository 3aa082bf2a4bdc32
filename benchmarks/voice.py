"""Voice-to-voice latency and barge-in over the Realtime WebSocket or a WebRTC call, with Piper speech; one JSON object.

    python -m benchmarks.voice                       # WebSocket; starts its own gateway on a free port
    python -m benchmarks.voice --transport webrtc    # the same workload over a WebRTC call made with aiortc
    python -m benchmarks.voice --url http://127.0.0.1:8000 --turns 10 --barge-in-runs 5 --sessions 2

What is measured (all clocks on this machine; the gateway's `gateway_latency.epoch_ms` is wall time):
- The "microphone" streams 20 ms chunks paced by the wall clock, without pause: silence between
  utterances, as a real microphone would. A sample is "spoken" at t0 + index / rate, and its chunk
  leaves when it is complete. WebSocket: pcm16 24 kHz `input_audio_buffer.append` events. WebRTC: a
  48 kHz track, each frame returned to aiortc (which encodes it to Opus and sends it) when complete.
- Voice-to-voice: from the last speech sample of the question (found by energy, not the clip's end
  with Piper's trailing silence; placed within its chunk) to the answer's first audio received.
  WebSocket: the first `response.output_audio.delta`. WebRTC: the first loud 20 ms frame (RMS > 300)
  on the gateway's track, which plays silence between replies (the server decides what the caller
  hears).
- Stages of the same turn, from the `response.done` latency marks; they add up to voice-to-voice
  (for a preempted turn, whose reply began generating from the speculative transcript before the
  final one existed, llm_first_token is ~0 and generation_head_start_ms says by how much it led):
  vad_stop_wait (end of speech -> the gateway's speech_stopped), asr (-> final transcript),
  response_start (-> response created), llm_first_token, first_clause_wait (-> the first clause of
  text is complete; when the gateway marks it), tts_first_audio (-> first audio handed to the
  socket or queued for the WebRTC track: Piper), delivery (-> received here; over WebRTC: the
  track's next frame, Opus, RTP, decoding, and this caller's aiortc receive jitter buffer, which
  hands a frame on once 4 more have arrived: 80 ms; the gateway waits for 1, see
  --webrtc-audio-reorder-frames).
- Barge-in: a story is asked for; 1.5 s after its first audio arrives, "Wait, stop." is streamed.
  From the time the chunk with the first speech of that utterance left to: the speech_started
  event (a WebSocket client flushes its playback there), the last audio of the story received
  (over WebRTC, where the gateway stops the audio, this is when the caller stops hearing it),
  `output_audio_buffer.cleared` (WebRTC), and the story's `response.done` (status cancelled; over
  WebRTC a story already generated may still be playing: its cleared audio counts as interrupted).
  Each barge-in run has a session of its own.
- WebRTC: a loud frame is audio of the oldest response still playing (one plays at a time): from
  its response.created until 0.5 s with no loud frame after its output_audio_buffer.stopped or
  .cleared (frames in flight). Its response.done (sent when everything is generated, often before
  it is heard) is handed on after that stopped/cleared event, with its own arrival time: a turn is
  over once its answer has played. Durations of audio (answer_audio_s, story_audio_s,
  audio_received_after_onset_ms) count loud frames, an answer's until its stopped event. Also:
  output_audio_buffer.started -> first loud frame (the media path), cleared -> last loud frame
  (audio in flight), and per call the frames' inter-arrival times, aiortc's RTP jitter, loss, RTT.
Turn detection is the gateway's default server_vad. One warm-up turn per session is not counted.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from benchmarks.voice_audio import Clip, Speaker
from gateway.bench.clients import BenchError, Target
from gateway.bench.stages import CLIENT, ClockOffset, turn_stages
from gateway.bench.stats import describe as summary
from gateway.bench.voice import VOICE_RATE, Heard, SessionLog, SpokenClient
from gateway.platform.processes import GatewayProcess, get_json

MODEL = "smollm2-135m-instruct"
QUESTIONS = [
    "What is the capital of France?",
    "How many legs does a spider have?",
    "What color is the sky on a clear day?",
    "What is the largest planet in our solar system?",
    "Which animal is known as the king of the jungle?",
]
WARMUP = "Hello, can you hear me?"
STORY = "Tell me a long story about a dragon."
STOP = "Wait, stop."
STORY_INSTRUCTIONS = (
    "You are a storyteller. When you are asked for a story, tell a long story of at least ten sentences. "
    "When you are asked to stop, answer in a few words."
)
# The stages of a turn from the gateway's latency marks (gateway.bench.stages), from the end of speech here to
# the first audio received here; tts_first_audio starts at the first token when no clause was marked.
STAGE_CHAIN = (
    ("vad_stop_wait", CLIENT, "speech_stopped"),
    ("asr", "speech_stopped", "transcript_final"),
    ("response_start", "transcript_final", "response_created"),
    ("llm_first_token", "response_created", "first_token"),
    ("first_clause_wait", "first_token", "first_clause"),
    ("tts_first_audio", ("first_clause", "first_token"), "first_audio"),
    ("delivery", "first_audio", CLIENT),
)
STAGES = tuple(name for name, _, _ in STAGE_CHAIN)
EVENT_TIMEOUT_S = 60.0
# What ends a session's run: the gateway closed it (BenchError) or sent what is not JSON (ValueError).
SESSION_ENDED = (BenchError, ValueError)


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def finished(item: object) -> bool:
    return isinstance(item, dict) and item.get("type") == "response.done"


# -- voice turns ------------------------------------------------------------------------------------


async def voice_turn(session: SpokenClient, clip: Clip) -> dict[str, Any]:
    """Say one question; wait for the answer's response.done; measure from the end of speech."""
    events = SessionLog()
    said = session.say(clip.pcm, (clip.onset, clip.end))
    record: dict[str, Any] = {"question": clip.text}
    answer: Heard | None = None
    try:
        while answer is None:
            # A deadline per event, not per turn: over WebRTC the answer is over once heard, in real time.
            received, item = await session.next(time.perf_counter() + EVENT_TIMEOUT_S)
            heard = events.feed(received, item)
            if heard is None or not finished(item) or said.speech_end is None:
                continue
            if heard.created is None or heard.created < said.speech_end:
                continue
            if heard.status == "cancelled" and heard.reason == "turn_detected":
                continue  # the question was split in two turns; the answer to the rest follows
            answer = heard
    except TimeoutError:
        record["error"] = f"no event for {EVENT_TIMEOUT_S:.0f} s while waiting for the answer"
    except SESSION_ENDED as exc:
        record["error"] = str(exc)
    record["speech_started_events"] = len(events.speech_started)
    record["end_send_lag_ms"] = said.end_lag_ms
    record["transcript"] = events.transcripts[-1][1] if events.transcripts else None
    if events.errors:
        record["errors"] = events.errors
    if events.speech_stopped and said.stream_speech_end_ms is not None:
        # Where the gateway's VAD put the end, against where speech really ended in the stream.
        record["vad_end_error_ms"] = round(events.speech_stopped[-1][1]["audio_end_ms"] - said.stream_speech_end_ms, 1)
    if answer is None:
        return record
    record.update(status=answer.status, answer=answer.text.strip(), answer_audio_s=round(answer.audio_s, 2))
    if answer.first_audio is None or said.speech_end is None:
        record["error"] = f"no answer audio (status {answer.status})"
        return record
    end = said.speech_end
    record["voice_to_voice_ms"] = round((answer.first_audio - end) * 1000, 1)
    if answer.playout_started is not None:  # WebRTC: from the track sending it to the caller hearing it
        record["playout_started_to_first_audio_ms"] = round((answer.first_audio - answer.playout_started) * 1000, 1)
    marks = answer.marks or {}
    if marks.get("epoch_ms") is not None and all(
        marks.get(f"{m}_ms") is not None for m in ("transcript_final", "response_created", "first_token", "first_audio")
    ):
        record["stages_ms"] = turn_stages(marks, STAGE_CHAIN, start=end, end=answer.first_audio,
                                          clock=session.target.clock)
        started = marks.get("generation_started_ms")
        # Preempted: the reply's generation began from the speculative transcript, before the final one.
        record["preempted"] = started is not None and started < marks["transcript_final_ms"]
        if record["preempted"]:
            record["generation_head_start_ms"] = round(marks["transcript_final_ms"] - started, 1)
        record["gateway_latency"] = marks
    else:
        record["gateway_latency"] = marks or None
    return record


# -- barge-in ---------------------------------------------------------------------------------------


async def barge_in_run(session: SpokenClient, story: Clip, stop: Clip, after_s: float) -> dict[str, Any]:
    events = SessionLog()
    record: dict[str, Any] = {}
    asked = session.say(story.pcm, (story.onset, story.end))
    deadline = time.perf_counter() + EVENT_TIMEOUT_S
    try:
        # 1. The story starts playing.
        story_response: Heard | None = None
        while story_response is None or story_response.first_audio is None:
            received, item = await session.next(deadline)
            heard = events.feed(received, item)
            if story_response is None and (spoken := asked.speech_end) is not None:
                story_response = next((r for r in events.order if r.created is not None and r.created >= spoken), None)
            if finished(item) and heard is not None and heard is story_response and heard.first_audio is None:
                record["error"] = f"the story ended ({heard.status}) with no audio"
                return record
        # 2. `after_s` after its first audio, the user starts talking over it.
        interrupt_at = story_response.first_audio + after_s
        while (wait := interrupt_at - time.perf_counter()) > 0:
            with contextlib.suppress(TimeoutError):
                events.feed(*await session.next(time.perf_counter() + wait))
        if story_response.done is not None:
            record["error"] = f"the story was over ({story_response.status}) before the interruption"
            record["story_audio_s"] = round(story_response.audio_s, 2)
            return record
        said = session.say(stop.pcm, (stop.onset, stop.end))
        # 3. Until the story's response.done and the start of the reply to all of "Wait, stop." (the
        #    session ends with the run, so the reply need not be waited for).
        reply: Heard | None = None
        while story_response.done is None or reply is None:
            try:
                received, item = await session.next(
                    min(deadline, time.perf_counter() + (8.0 if story_response.done else EVENT_TIMEOUT_S))
                )
            except TimeoutError:
                if story_response.done is None:
                    raise
                break  # no reply to the interruption (empty transcript): fine
            events.feed(received, item)
            if (spoken := said.speech_end) is not None:
                reply = next((r for r in events.order if r.created is not None and r.created > spoken), None)
        onset = said.onset
        if onset is None:
            raise TimeoutError  # "Wait, stop." never left the microphone
        record["story_status"] = story_response.status
        record["story_reason"] = story_response.reason
        record["stop_transcript"] = events.transcripts[-1][1] if events.transcripts else None
        started_events = [(t, e) for t, e in events.speech_started if t >= onset]
        started = [t for t, _ in started_events]
        record["speech_started_after_onset"] = len(started)  # > 1: the VAD split "Wait, stop." in two turns
        after = [seconds for t, seconds in story_response.audio_at.items() if t >= onset]
        last_audio = story_response.last_audio
        record["onset_to_speech_started_ms"] = round((started[0] - onset) * 1000, 1) if started else None
        record["onset_to_last_audio_ms"] = round((last_audio - onset) * 1000, 1) if last_audio is not None else None
        if story_response.done >= onset:  # else generation was over and only its playout was interrupted
            record["onset_to_response_done_ms"] = round((story_response.done - onset) * 1000, 1)
        record["audio_received_after_onset_ms"] = round(1000 * sum(after), 1)
        record["story_audio_s"] = round(story_response.audio_s, 2)
        cleared = [t for t, e in events.cleared if t >= onset and e.get("response_id") == story_response.id]
        if cleared:  # WebRTC: the gateway dropped the queued audio; what was in flight still arrives
            record["onset_to_output_audio_cleared_ms"] = round((cleared[0] - onset) * 1000, 1)
            if last_audio is not None:
                record["cleared_to_last_audio_ms"] = round((last_audio - cleared[0]) * 1000, 1)
        if started and said.stream_onset_ms is not None:
            record["vad_onset_error_ms"] = round(started_events[0][1]["audio_start_ms"] - said.stream_onset_ms, 1)
        # Over WebRTC a story fully generated may still be playing: clearing its audio interrupts it too.
        record["story_interrupted"] = story_response.status == "cancelled" or bool(cleared)
        if not record["story_interrupted"]:
            record["error"] = f"the story was not interrupted (status {story_response.status})"
    except TimeoutError:
        record["error"] = "timed out"
    except SESSION_ENDED as exc:
        record["error"] = str(exc)
    if events.errors:
        record["errors"] = events.errors
    return record


# -- driver -----------------------------------------------------------------------------------------


@dataclass
class Workload:
    questions: list[Clip]
    warmup: Clip
    story: Clip
    stop: Clip
    turns: int
    barge_in_runs: int
    barge_in_after_s: float
    gap_s: float


Connect = Callable[[], Awaitable[SpokenClient]]  # opens a session, its microphone on


async def run_worker(connect: Connect, index: int, work: Workload, progress: Any) -> dict[str, Any]:
    await asyncio.sleep(index * 0.7)  # stagger concurrent sessions a little
    out: dict[str, Any] = {"turns": [], "barge_in": [], "mic_max_lag_ms": 0.0, "links": []}
    if work.turns:
        async with await connect() as session:
            await session.quiet(0.5)
            warm = await voice_turn(session, work.warmup)
            progress(
                f"session {index} warm-up: {warm.get('voice_to_voice_ms')} ms {warm.get('error', '')}", advance=False
            )
            for turn in range(work.turns):
                await session.quiet(work.gap_s)
                record = await voice_turn(session, work.questions[turn % len(work.questions)])
                record["session"] = index
                out["turns"].append(record)
                progress(
                    f"session {index} turn {turn + 1}: v2v {record.get('voice_to_voice_ms')} ms, "
                    f"heard {record.get('transcript')!r} {record.get('error', '')}"
                )
            out["mic_max_lag_ms"] = max(out["mic_max_lag_ms"], round(session.mic.max_lag_ms, 1))
            if (link := await session.link_stats()) is not None:
                out["links"].append({"session": f"s{index}", **link})
    # Each barge-in run in a session of its own: within one, the interrupted stories (over WebRTC cut
    # to what was heard) soon teach the model to answer the next request for a story in a sentence.
    measured = attempts = 0
    while measured < work.barge_in_runs and attempts < 2 * work.barge_in_runs:
        attempts += 1  # a story that ends before the interruption measures nothing: try again
        try:
            async with await connect() as session:
                await session.send(
                    {"type": "session.update", "session": {"type": "realtime", "instructions": STORY_INSTRUCTIONS}}
                )
                await session.expect("session.updated", timeout_s=10)
                await session.quiet(0.5)
                record = await barge_in_run(session, work.story, work.stop, work.barge_in_after_s)
                out["mic_max_lag_ms"] = max(out["mic_max_lag_ms"], round(session.mic.max_lag_ms, 1))
                if (link := await session.link_stats()) is not None:
                    out["links"].append({"session": f"b{index}.{attempts}", **link})
        except (*SESSION_ENDED, TimeoutError, OSError) as exc:  # this attempt's session failed, not the run
            record = {"error": f"session: {exc!r}"}
        record.update(session=index, attempt=attempts)
        out["barge_in"].append(record)
        ok = bool(record.get("story_interrupted"))
        measured += ok
        progress(
            f"session {index} barge-in attempt {attempts}: speech_started {record.get('onset_to_speech_started_ms')} ms, "
            f"last audio {record.get('onset_to_last_audio_ms')} ms, done {record.get('onset_to_response_done_ms')} ms "
            f"{record.get('error', '')}",
            advance=ok,
        )
    for _ in range(work.barge_in_runs - measured):
        progress(f"session {index}: barge-in run not measured", advance=True)
    return out


def aggregate(
    results: list[dict[str, Any]], args: argparse.Namespace, health: Any, audio_in: dict[str, Any]
) -> dict[str, Any]:
    turns = [t for r in results for t in r["turns"]]
    runs = [b for r in results for b in r["barge_in"]]
    good = [t for t in turns if "voice_to_voice_ms" in t]
    staged = [t for t in good if "stages_ms" in t]
    stages = {name: summary([t["stages_ms"][name] for t in staged if name in t["stages_ms"]]) for name in STAGES}
    # Share of each stage in the same turn's voice-to-voice time, then the median over turns.
    shares = {}
    for name in STAGES:
        values = [100 * t["stages_ms"][name] / t["voice_to_voice_ms"] for t in staged if name in t["stages_ms"]]
        shares[name] = round(statistics.median(values), 1) if values else None
    interrupted = [b for b in runs if b.get("story_interrupted")]
    barge_in = {
        "after_first_audio_s": args.barge_in_after,
        "attempts": len(runs),
        "interrupted": len(interrupted),
        "cancelled": sum(1 for b in interrupted if b.get("story_status") == "cancelled"),
        "story_over_before_interruption": sum(
            1 for b in runs if str(b.get("error", "")).startswith("the story was over")
        ),
        "runs_split_by_vad": sum(1 for b in interrupted if b.get("speech_started_after_onset", 0) > 1),
        "runs_with_error_events": sum(1 for b in runs if b.get("errors")),
        "onset_to_speech_started_ms": summary(
            [b["onset_to_speech_started_ms"] for b in interrupted if b.get("onset_to_speech_started_ms") is not None]
        ),
        # 0 when no story audio arrived after the onset (the gateway had already sent all it made).
        "onset_to_last_audio_ms": summary(
            [max(0.0, b["onset_to_last_audio_ms"]) for b in interrupted if b.get("onset_to_last_audio_ms") is not None]
        ),
        "runs_with_audio_after_onset": sum(1 for b in interrupted if b.get("audio_received_after_onset_ms", 0) > 0),
        "onset_to_response_done_ms": summary(
            [b["onset_to_response_done_ms"] for b in interrupted if "onset_to_response_done_ms" in b]
        ),
        "audio_received_after_onset_ms": summary([b["audio_received_after_onset_ms"] for b in interrupted]),
        "vad_onset_error_ms": summary([b["vad_onset_error_ms"] for b in interrupted if "vad_onset_error_ms" in b]),
    }
    webrtc: dict[str, Any] = {}
    if args.transport == "webrtc":
        for name in ("onset_to_output_audio_cleared_ms", "cleared_to_last_audio_ms"):
            barge_in[name] = summary([b[name] for b in interrupted if name in b])
        webrtc = {
            "playout_started_to_first_audio_ms": summary(
                [t["playout_started_to_first_audio_ms"] for t in good if "playout_started_to_first_audio_ms" in t]
            ),
            "links": [link for r in results for link in r["links"]],
        }
    return {
        "benchmark": "voice",
        "transport": args.transport,
        "url": args.url,
        "sessions": args.sessions,
        "gateway": health,
        "input": audio_in,
        "voice_to_voice_ms": summary([t["voice_to_voice_ms"] for t in good]),
        "stages_ms": stages,
        "stage_share_of_voice_to_voice_pct_median": shares,
        "vad_end_error_ms": summary([t["vad_end_error_ms"] for t in turns if "vad_end_error_ms" in t]),
        "turns_ok": len(good),
        "turns_total": len(turns),
        "turns_split_by_vad": sum(1 for t in turns if t.get("speech_started_events", 1) > 1),
        "turns_preempted": sum(1 for t in staged if t.get("preempted")),
        "generation_head_start_ms": summary([t["generation_head_start_ms"] for t in staged if t.get("preempted")]),
        "barge_in": barge_in,
        "mic_max_lag_ms": max((r["mic_max_lag_ms"] for r in results), default=0.0),
        "end_send_lag_ms": summary([t["end_send_lag_ms"] for t in turns if "end_send_lag_ms" in t]),
        **webrtc,
        "errors": [x for x in turns + runs if "error" in x],
        "turns": turns,
        "barge_in_runs": runs,
    }


def connector(args: argparse.Namespace, http: httpx.AsyncClient) -> tuple[Connect, int]:
    """How a session of the chosen transport is opened, and its microphone's sample rate. The gateway's default
    session, and a microphone that streams without pause; the gateway reads this machine's clock."""
    clock = ClockOffset.same_clock((time.time() - time.perf_counter()) * 1000)
    # max_tokens goes unused: an unconfigured session keeps the gateway's own limit.
    target = Target(args.url.rstrip("/"), MODEL, api_key=None, max_tokens=0, seed=None, clock=clock)
    if args.transport == "webrtc":
        from gateway.bench.webrtc import RTC_RATE, Playback, RealtimeCallClient

        async def call() -> SpokenClient:
            # aioice never offers 127.0.0.1 by itself: on a loopback-only host the call could not connect.
            return await RealtimeCallClient.open(target, http, None, None, configure=False, playback=Playback(),
                                                 ice_host=args.ice_host)

        return call, RTC_RATE

    async def socket() -> SpokenClient:
        from gateway.bench.voice import RealtimeVoiceClient

        return await RealtimeVoiceClient.open(target, None, None, configure=False, always_on=True)

    return socket, VOICE_RATE


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    console = Console(stderr=True)
    gateway: GatewayProcess | None = None
    if args.url is None:
        log_path = Path(args.log or Path(tempfile.gettempdir()) / "benchmarks-voice-gateway.log")
        gateway = GatewayProcess(log_path).start()
        args.url = gateway.url
        console.print(f"starting the gateway on {gateway.url} (log: {log_path})")
    try:
        async with httpx.AsyncClient(timeout=30) as http:  # a WebRTC call's offer and hang-up
            connect, rate = connector(args, http)
            speaker = Speaker()
            clips = {text: speaker.say(text, rate) for text in [*QUESTIONS, WARMUP, STORY, STOP]}
            speaker.close()
            if gateway is not None:
                await asyncio.to_thread(gateway.wait_ready, args.ready_timeout)
            status, health = get_json(f"{args.url}/healthz")
            if status != 200:
                raise RuntimeError(f"{args.url}/healthz answered {status}: {health}")
            work = Workload(
                questions=[clips[q] for q in QUESTIONS],
                warmup=clips[WARMUP],
                story=clips[STORY],
                stop=clips[STOP],
                turns=args.turns,
                barge_in_runs=args.barge_in_runs,
                barge_in_after_s=args.barge_in_after,
                gap_s=args.gap,
            )
            total = args.sessions * (args.turns + args.barge_in_runs)
            with Progress(
                TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), console=console
            ) as bar:
                task = bar.add_task("voice turns and barge-ins", total=total)

                def progress(message: str, advance: bool = True) -> None:
                    bar.console.print(message)
                    if advance:
                        bar.advance(task)

                results = await asyncio.gather(*(run_worker(connect, i, work, progress) for i in range(args.sessions)))
            audio_in = {
                "format": "pcm16" if args.transport == "websocket" else "opus (aiortc track)",
                "rate": rate,
                "chunk_ms": 20,
                "paced": "wall clock",
                "speech": {c.text: {"speech_s": round(c.speech_s, 2)} for c in clips.values()},
            }
            return aggregate(list(results), args, health, audio_in)
    finally:
        if gateway is not None:
            gateway.stop()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.voice", description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", help="a running gateway (http://host:port); default: start one on a free port")
    parser.add_argument(
        "--transport",
        choices=("websocket", "webrtc"),
        default="websocket",
        help="the Realtime WebSocket (default) or a WebRTC call made with aiortc",
    )
    parser.add_argument(
        "--ice-host",
        default="127.0.0.1",
        help="WebRTC: the address this caller offers as its ICE candidate (127.0.0.1)",
    )
    parser.add_argument("--turns", type=int, default=10, help="voice turns per session (default 10)")
    parser.add_argument("--barge-in-runs", type=int, default=5, help="measured barge-in runs per session (default 5)")
    parser.add_argument("--barge-in-after", type=float, default=1.5, help="seconds after the story's first audio (1.5)")
    parser.add_argument("--sessions", type=int, default=1, help="concurrent sessions, each doing the whole workload")
    parser.add_argument("--gap", type=float, default=1.0, help="seconds with no event before the next utterance")
    parser.add_argument("--ready-timeout", type=float, default=180.0, help="seconds to wait for a started gateway")
    parser.add_argument("--log", help="log file of a started gateway")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        report = asyncio.run(main_async(args))
    except (RuntimeError, TimeoutError, OSError, BenchError) as exc:
        # The gateway did not start or could not be reached: still one JSON object on stdout.
        log(f"benchmark aborted: {exc}")
        print(json.dumps({"benchmark": "voice", "url": args.url, "error": str(exc).splitlines()[0]}, indent=2))
        return 2
    print(json.dumps(report, indent=2))
    return 0 if report["turns_ok"] or report["barge_in"]["interrupted"] else 1


if __name__ == "__main__":
    sys.exit(main())
