"""Turn-taking on a spoken test set (benchmarks/turn_taking_set.py): when each end-of-turn detector ends a turn,
what stops a reply, and Whisper's word error rate with and without noise reduction. Prints JSON.

    python -m benchmarks.turn_taking [--eagerness auto] [--out report.json]

The detectors are the gateway's own policy (gateway/protocol/session_config.py: `turn_end_wait_ms`) on the
gateway's models, fed 20 ms at a time through the session's VAD (Silero, as media/vad.py runs it):
- server_vad: the turn ends after the default silence (--vad-silence-duration-ms, 400 ms);
- semantic_vad (text): after 64 ms of silence, Whisper's transcript so far goes to the LLM's judge
  (inference/llm/end_of_turn.py), which sets the silence; the ASR's and the judge's time counts;
- semantic_vad (audio): the audio model (inference/turn_end.py) on the turn's audio so far sets it;
- semantic_vad (audio + text): both, as the gateway combines them (words cut off veto an early end), from
  when the slower judge answers.
A judge's answer ends the turn when it arrives or when the silence it sets has run, whichever is later; speech
again before that and the turn goes on (a paused utterance ended early is one ended in its pause).

Replies: `at_once` is the barge-in of a WebSocket session: the reply stops when the VAD hears speech of
--min-barge-in-speech-ms (160) over it; `paused` is a WebRTC session's with --resume-false-interruptions (the
default): that speech pauses the reply, which stops only for words that are not a backchannel. Timings are this machine's (name its CPU with lscpu).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import re
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from benchmarks.turn_taking_set import RATE, Utterance, build
from benchmarks.voice_audio import Speaker, speech_span
from gateway.protocol.session_config import turn_end_wait_ms
from gateway.realtime.barge_in import LONGEST_BACKCHANNEL_S, is_backchannel
from media.denoise import NoiseReducer, NoiseReduction
from media.frames import AudioChunk
from media.vad import SileroVad, SpeechStarted, StreamingVad, VadSettings

CHUNK = RATE // 50  # 20 ms, as a WebRTC frame
JUDGE_AFTER_MS = 64  # the silence before the judges start (gateway/realtime/listening.py SPECULATIVE_SILENCE_MS)
SERVER_VAD_SILENCE_MS = 400
BARGE_IN_SPEECH_MS = 160
DETECTORS = ("server_vad", "semantic_vad_text", "semantic_vad_audio", "semantic_vad_audio_text")


@dataclass
class Judges:
    asr: Any  # inference.asr.AsrEngine
    audio: Any  # inference.turn_end.TurnEndModel
    text: Any  # inference.llm.end_of_turn.EndOfTurnModel


@dataclass
class Judgement:
    wait_ms: int
    answered_ms: float  # stream time at which the judge answered


async def _judgements(detector: str, audio: np.ndarray, now_ms: float, eagerness: str,
                      judges: Judges) -> list[Judgement]:
    if detector == "server_vad":
        return [Judgement(SERVER_VAD_SILENCE_MS, now_ms)]
    found = [Judgement(turn_end_wait_ms(eagerness), now_ms)]  # until the judges answer: the longest wait
    pcm = audio.astype(np.float32) / 32768.0
    p_audio = p_text = None
    audio_s = text_s = 0.0
    if detector in ("semantic_vad_audio", "semantic_vad_audio_text"):
        started = time.perf_counter()
        p_audio = await judges.audio.probability(pcm)
        audio_s = time.perf_counter() - started
    if detector in ("semantic_vad_text", "semantic_vad_audio_text"):
        started = time.perf_counter()
        transcript = await judges.asr.transcribe(pcm, final=True)
        p_text = await judges.text.probability(transcript.text) if transcript is not None and transcript.text.strip() else 0.0
        text_s = time.perf_counter() - started
    # The gateway runs both judges at once and answers when both have (gateway/realtime/voice.py).
    found.append(Judgement(turn_end_wait_ms(eagerness, audio=p_audio, text=p_text), now_ms + 1000 * max(audio_s, text_s)))
    return found


async def turn_end_ms(utterance: Utterance, detector: str, eagerness: str, judges: Judges,
                      vad_path: Path) -> float | None:
    """Stream time at which the detector ends the turn (None: never, within the trailing silence)."""
    vad = StreamingVad(SileroVad(vad_path), VadSettings(silence_duration_ms=10**6, min_speech_ms=0))
    pcm = utterance.pcm
    heard = False
    ends_at: float | None = None  # this silence's end of the turn, once judged
    for start in range(0, len(pcm) - CHUNK + 1, CHUNK):
        vad.process(AudioChunk(pcm[start:start + CHUNK], RATE))
        detector_state = vad.detector
        heard = heard or detector_state.in_speech
        silence_started = detector_state.silence_started_ms
        if not heard:
            continue
        if silence_started is None:
            ends_at = None  # speech again: the judgements of the last silence are dropped
            continue
        position = vad.position_ms
        if ends_at is None and position - silence_started >= JUDGE_AFTER_MS:
            judgements = await _judgements(detector, pcm[:start + CHUNK], position, eagerness, judges)
            ends_at = min(max(silence_started + j.wait_ms, j.answered_ms) for j in judgements)
        if ends_at is not None and position >= ends_at:
            return ends_at
    return None


def stops_a_reply(utterance: Utterance, vad_path: Path, span: tuple[int, int] | None = None) -> bool:
    """Whether the VAD hears speech long enough to barge in, within `span` (samples; default the whole clip)."""
    pcm = utterance.pcm if span is None else utterance.pcm[span[0]:span[1]]
    vad = StreamingVad(SileroVad(vad_path), VadSettings(min_speech_ms=BARGE_IN_SPEECH_MS))
    for start in range(0, len(pcm) - CHUNK + 1, CHUNK):
        if any(isinstance(e, SpeechStarted) for e in vad.process(AudioChunk(pcm[start:start + CHUNK], RATE))):
            return True
    return False


def _words(text: str) -> list[str]:
    return re.sub(r"[^a-z0-9' ]", " ", text.lower().replace("-", " ")).split()


def word_errors(reference: str, hypothesis: str) -> tuple[int, int]:
    """(edits, reference words): the word-level Levenshtein distance."""
    ref, hyp = _words(reference), _words(hypothesis)
    row = list(range(len(hyp) + 1))
    for i in range(1, len(ref) + 1):
        diagonal, row[0] = row[0], i
        for j in range(1, len(hyp) + 1):
            diagonal, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, diagonal + (ref[i - 1] != hyp[j - 1]))
    return row[len(hyp)], len(ref)


def _percentiles(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"p50": None, "p95": None}
    ordered = sorted(values)
    return {"p50": round(statistics.median(ordered), 1),
            "p95": round(ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))], 1)}


async def measure_detectors(utterances: list[Utterance], eagerness: str, judges: Judges, vad_path: Path,
                            detectors: tuple[str, ...] = DETECTORS) -> dict[str, Any]:
    paused = [u for u in utterances if u.kind == "paused"]
    complete = [u for u in utterances if u.kind == "complete"]
    report: dict[str, Any] = {}
    for detector in detectors:
        early = 0
        for u in paused:
            assert u.pause is not None
            end = await turn_end_ms(u, detector, eagerness, judges, vad_path)
            early += end is not None and end < 1000 * u.speech_end / RATE
        delays = []
        never = 0
        for u in complete:
            end = await turn_end_ms(u, detector, eagerness, judges, vad_path)
            if end is None:
                never += 1
            else:
                delays.append(end - 1000 * u.speech_end / RATE)
        report[detector] = {"ended_too_early_pct": round(100 * early / len(paused), 1),
                            "end_of_turn_delay_ms": _percentiles(delays), "never_ended": never}
    return report


async def measure_replies(utterances: list[Utterance], judges: Judges, vad_path: Path) -> dict[str, Any]:
    """Over a reply, as a WebSocket session (and a WebRTC one with --no-resume-false-interruptions) takes it:
    speech the VAD hears for 160 ms stops it; and as a WebRTC session takes it now (gateway/realtime/barge_in.py):
    that speech pauses it, and it stops only when Whisper's words are not a backchannel (the gateway's own test,
    `is_backchannel`: words Whisper is unsure of count as none) or the speech outlasts one (1.2 s)."""
    stopped: dict[str, dict[str, int]] = {"backchannel": {"at_once": 0, "paused": 0},
                                         "interruption": {"at_once": 0, "paused": 0}}
    counts = {"backchannel": 0, "interruption": 0}
    for u in utterances:
        if u.kind not in stopped:
            continue
        counts[u.kind] += 1
        if not stops_a_reply(u, vad_path):
            continue
        stopped[u.kind]["at_once"] += 1
        onset, end = speech_span(u.pcm, RATE)
        transcript = await judges.asr.transcribe(u.pcm[:end + RATE // 5].astype(np.float32) / 32768.0, final=True)
        words, avg_logprob = (transcript.text, transcript.avg_logprob) if transcript is not None else ("", None)
        stopped[u.kind]["paused"] += ((end - onset) / RATE >= LONGEST_BACKCHANNEL_S
                                      or not is_backchannel(words, avg_logprob))
    return {
        rule: {
            "backchannels_that_stopped_the_reply_pct": round(100 * stopped["backchannel"][rule] / counts["backchannel"], 1),
            "interruptions_that_did_not_pct": round(
                100 * (counts["interruption"] - stopped["interruption"][rule]) / counts["interruption"], 1),
        }
        for rule in ("at_once", "paused")
    }


async def measure_noise(utterances: list[Utterance], judges: Judges, vad_path: Path) -> dict[str, Any]:
    """WER of the noisy set as heard, and after each noise reduction; and how often the noise alone (the
    trailing seconds after the speech) would barge in."""
    noisy = [u for u in utterances if u.kind == "noisy"]
    report: dict[str, Any] = {}
    settings: tuple[NoiseReduction | Literal["none", "clean speech"], ...] = (
        "none", "near_field", "far_field", "clean speech")
    for setting in settings:
        errors = words = false_barge_ins = 0
        spent = 0.0
        frames = 0
        for u in noisy:
            pcm = u.pcm
            if setting == "clean speech":
                assert u.clean is not None
                pcm = u.clean
            elif setting != "none":
                enhancer = NoiseReducer(setting)
                started = time.perf_counter()
                pcm = np.concatenate([enhancer.process(pcm[i:i + CHUNK]) for i in range(0, len(pcm), CHUNK)])
                spent += time.perf_counter() - started
                frames += len(u.pcm) // CHUNK
                enhancer.close()
            transcript = await judges.asr.transcribe(pcm[:u.speech_end + RATE // 2].astype(np.float32) / 32768.0,
                                                     final=True)
            e, n = word_errors(u.text, transcript.text if transcript is not None else "")
            errors, words = errors + e, words + n
            after = Utterance(u.kind, "", pcm, u.speech_end)
            false_barge_ins += stops_a_reply(after, vad_path, (u.speech_end + RATE // 5, len(pcm)))
        report[setting] = {"wer": round(errors / words, 3),
                           "noise_alone_barges_in_pct": round(100 * false_barge_ins / len(noisy), 1)}
        if frames:
            report[setting]["ms_per_20ms_frame"] = round(1000 * spent / frames, 2)
    return report


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    from gateway.platform.config import default_cache_dir
    from inference.asr import AsrEngine
    from inference.llm.end_of_turn import EndOfTurnModel
    from inference.llm.engine import LLMEngine
    from inference.llm.loader import load_lm
    from inference.models import embedded_asr, embedded_llm, embedded_turn_model, silero_vad_path
    from inference.turn_end import TurnEndModel
    speaker = Speaker()
    utterances = build(speaker, seed=args.seed)
    speaker.close()
    vad_path = silero_vad_path()
    asr = AsrEngine.load(embedded_asr(), threads=1)
    audio = TurnEndModel.load(embedded_turn_model())
    lm = await asyncio.to_thread(load_lm, embedded_llm(), cache_dir=default_cache_dir())
    engine = LLMEngine(lm)
    engine.start()
    try:
        judges = Judges(asr=asr, audio=audio, text=EndOfTurnModel(engine))
        counts = {kind: sum(u.kind == kind for u in utterances) for kind in
                  ("complete", "paused", "backchannel", "interruption", "noisy")}
        return {
            "cpu": _cpu_name(),
            "eagerness": args.eagerness,
            "utterances": counts,
            "turn_end": await measure_detectors(utterances, args.eagerness, judges, vad_path),
            "replies": await measure_replies(utterances, judges, vad_path),
            "noise": await measure_noise(utterances, judges, vad_path),
        }
    finally:
        engine.close()
        asr.close()
        audio.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--eagerness", default="auto", choices=("low", "medium", "high", "auto"))
    parser.add_argument("--seed", type=int, default=0, help="the noise's and the coughs' random seed")
    parser.add_argument("--out", type=Path, help="also write the JSON report here")
    args = parser.parse_args(argv)
    report = asyncio.run(main_async(args))
    text = json.dumps(report, indent=2)
    print(text)
    if args.out is not None:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
