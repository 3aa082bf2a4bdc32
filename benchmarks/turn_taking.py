"""Turn-taking on a spoken test set in several voices (benchmarks/turn_taking_set.py): when each end-of-turn
detector ends a turn, what stops a reply, and Whisper's word error rate with and without noise. Prints JSON, each
figure per voice, over all voices, and over the voices other than the gateway's own output voice (Piper joe).

    python -m benchmarks.turn_taking [--voices piper:joe,espeak:en-gb@150,human] [--eagerness auto]
                                     [--asr-model DIR] [--no-enhancers] [--out report.json]

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
`complete_ended_within_300_ms_pct` sits beside `ended_too_early_pct` as LiveKit's eot-bench pairs its figures.

Replies: `at_once` is the barge-in of a Realtime WebSocket session: the reply stops when the VAD hears speech of
--min-barge-in-speech-ms (160) over it; `paused` is a WebRTC or GPT-Live session's with
--resume-false-interruptions (the default), whatever the turn detector (`over_a_reply`): that speech holds the
reply, its voiced length and the words of its first short silence decide, with how long a backchannel held the
reply. `avg_logprob` has Whisper's confidence in each kind of utterance per voice, and `calibration` the
threshold below which words count as unreadable that makes the fewest errors over the voices other than the
output voice. Timings are this machine's (name its CPU with lscpu).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import re
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from benchmarks.turn_taking_set import PIPER, RATE, Utterance, build, recordings
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
HUMAN = "human"  # the recordings that packages carry (turn_taking_set.recordings), each a voice of its own


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
        never = cut = 0
        for u in complete:
            end = await turn_end_ms(u, detector, eagerness, judges, vad_path)
            if end is None:
                never += 1
            elif end < 1000 * u.speech_end / RATE:
                cut += 1  # ended in a pause inside it (the human recordings have them: "Front, center")
            else:
                delays.append(end - 1000 * u.speech_end / RATE)
        report[detector] = {"ended_too_early_pct": _pct(early, len(paused)),
                            "end_of_turn_delay_ms": _percentiles(delays), "never_ended": never,
                            "complete_ended_inside_pct": _pct(cut, len(complete)),
                            # LiveKit's eot-bench pair: its false cut-offs beside how many true ends come this soon.
                            "complete_ended_within_300_ms_pct": _pct(sum(d <= 300 for d in delays), len(complete))}
    return report


@dataclass
class Overlap:
    """What the gateway does with one utterance spoken over its reply (gateway/realtime/barge_in.py)."""

    stopped: bool  # the reply was interrupted
    held_ms: float  # how long its audio was held, in all
    decided_ms: float | None  # from the end of the speech to the last decision on its words (None: none)


async def over_a_reply(utterance: Utterance, judges: Judges, vad_path: Path) -> Overlap | None:
    """The utterance over a playing reply, as a WebRTC or GPT-Live session takes it now, whatever the turn detector:
    speech the VAD hears for 160 ms holds the reply; voiced past LONGEST_BACKCHANNEL_S it interrupts; at 64 ms of
    silence the speech so far is transcribed (the speculative transcript, its ASR time counted) and
    `is_backchannel` decides: the reply plays on, or is interrupted; speech again holds it again; the final
    transcript of the whole speech confirms. None: the VAD never heard speech (it never paused the reply)."""
    pcm = utterance.pcm
    vad = StreamingVad(SileroVad(vad_path), VadSettings(min_speech_ms=BARGE_IN_SPEECH_MS, silence_duration_ms=10**6))
    held_since: float | None = None
    held_ms = 0.0
    decided_ms: float | None = None
    judged_silence: float | None = None  # the silence whose speculative transcript was made
    started = False
    speech_end_ms = 1000 * utterance.speech_end / RATE
    for start in range(0, len(pcm) - CHUNK + 1, CHUNK):
        events = vad.process(AudioChunk(pcm[start:start + CHUNK], RATE))
        position = vad.position_ms
        detector = vad.detector
        if any(isinstance(e, SpeechStarted) for e in events):
            started, held_since = True, position
        if not started:
            continue
        if detector.voiced_ms >= 1000 * LONGEST_BACKCHANNEL_S:
            return Overlap(True, held_ms + (position - held_since if held_since is not None else 0.0), decided_ms)
        silence = detector.silence_started_ms
        if silence is None:
            if held_since is None:  # speech again after words judged a backchannel
                held_since = position
            continue
        if held_since is None or position - silence < JUDGE_AFTER_MS or judged_silence == silence:
            continue
        judged_silence = silence
        began = time.perf_counter()
        transcript = await judges.asr.transcribe(pcm[:start + CHUNK].astype(np.float32) / 32768.0, final=True)
        decided = position + 1000 * (time.perf_counter() - began)
        decided_ms = decided - speech_end_ms  # the last decision's (a pause inside the speech may decide first)
        held_ms += decided - held_since
        held_since = None
        words, avg_logprob = (transcript.text, transcript.avg_logprob) if transcript is not None else ("", None)
        if not is_backchannel(words, avg_logprob):
            return Overlap(True, held_ms, decided_ms)
    if not started:
        return None
    final = await judges.asr.transcribe(pcm[:utterance.speech_end + RATE // 5].astype(np.float32) / 32768.0, final=True)
    words, avg_logprob = (final.text, final.avg_logprob) if final is not None else ("", None)
    return Overlap(not is_backchannel(words, avg_logprob), held_ms, decided_ms)


async def measure_replies(utterances: list[Utterance], judges: Judges, vad_path: Path) -> dict[str, Any]:
    """Over a reply: `at_once`, as a Realtime WebSocket session (or WebRTC with --no-resume-false-interruptions)
    takes it: speech the VAD hears for 160 ms stops it; `paused`, as WebRTC and GPT-Live take it (over_a_reply):
    with how long a backchannel held the reply (p50/p95) and how soon after its end the first decision came."""
    stopped = {"backchannel": {"at_once": 0, "paused": 0}, "interruption": {"at_once": 0, "paused": 0}}
    counts = {"backchannel": 0, "interruption": 0}
    held: list[float] = []
    decided: list[float] = []
    for u in utterances:
        if u.kind not in stopped:
            continue
        counts[u.kind] += 1
        overlap = await over_a_reply(u, judges, vad_path)
        if overlap is None:
            continue
        stopped[u.kind]["at_once"] += 1
        stopped[u.kind]["paused"] += overlap.stopped
        if overlap.decided_ms is not None:
            decided.append(overlap.decided_ms)
        if u.kind == "backchannel" and not overlap.stopped:
            held.append(overlap.held_ms)
    report: dict[str, Any] = {
        rule: {
            "backchannels_that_stopped_the_reply_pct": _pct(stopped["backchannel"][rule], counts["backchannel"]),
            "interruptions_that_did_not_pct": _pct(counts["interruption"] - stopped["interruption"][rule],
                                                   counts["interruption"]),
        }
        for rule in ("at_once", "paused")
    }
    report["paused"]["backchannel_pause_ms"] = _percentiles(held)
    report["paused"]["decided_after_speech_end_ms"] = _percentiles(decided)
    return report


def _pct(part: int, whole: int) -> float | None:
    return round(100 * part / whole, 1) if whole else None


async def confidences(utterances: list[Utterance], judges: Judges) -> dict[str, list[float | None]]:
    """Whisper's average log-probability of each clean utterance by kind (`text` for the words it heard)."""
    found: dict[str, list[float | None]] = {}
    for u in utterances:
        if u.kind == "noisy":
            continue
        transcript = await judges.asr.transcribe(u.pcm[:u.speech_end + RATE // 5].astype(np.float32) / 32768.0,
                                                 final=True)
        kind = "cough" if u.kind == "backchannel" and not u.text else u.kind
        found.setdefault(kind, []).append(transcript.avg_logprob if transcript is not None else None)
        if u.kind in ("backchannel", "interruption") and transcript is not None:
            found.setdefault(f"{kind}_heard", []).append(transcript.text)  # type: ignore[arg-type]
    return found


def calibrate(by_voice: dict[str, dict[str, list[Any]]], exclude: str) -> dict[str, Any]:
    """The confidence threshold (LEAST_READABLE_LOGPROB) that makes the fewest errors over every voice but
    `exclude` (the output voice): a backchannel Whisper heard as other words and is sure of stops the reply; an
    interruption it is unsure of plays on (if short; speech voiced past 1.2 s stops it by its length)."""
    backchannels = [(p, h) for v, f in by_voice.items() if v != exclude
                    for p, h in zip(f.get("backchannel", []), f.get("backchannel_heard", []), strict=False)]
    interruptions = [p for v, f in by_voice.items() if v != exclude for p in f.get("interruption", []) if p is not None]
    table = []
    for step in range(-40, 1):
        threshold = step / 20
        bc_errors = sum(1 for p, heard in backchannels if not is_backchannel_at(heard, p, threshold))
        int_errors = sum(1 for p in interruptions if p < threshold)
        table.append({"threshold": threshold, "backchannels_stopping": bc_errors, "interruptions_unsure": int_errors})
    fewest = min(row["backchannels_stopping"] + row["interruptions_unsure"] for row in table)
    best = [row["threshold"] for row in table if row["backchannels_stopping"] + row["interruptions_unsure"] == fewest]
    return {"by_threshold": table, "fewest_errors": fewest, "fewest_errors_between": [best[0], best[-1]],
            "midpoint": round((best[0] + best[-1]) / 2, 3), "backchannels": len(backchannels),
            "interruptions": len(interruptions)}


def is_backchannel_at(heard: str, avg_logprob: float | None, threshold: float) -> bool:
    """is_backchannel with another confidence threshold."""
    if avg_logprob is not None and avg_logprob < threshold:
        return True
    return is_backchannel(heard, None)


def _quantiles(values: list[Any]) -> dict[str, float] | None:
    numbers = sorted(v for v in values if isinstance(v, float))
    if not numbers:
        return None
    return {"min": round(numbers[0], 2), "p10": round(float(np.quantile(numbers, 0.1)), 2),
            "p50": round(float(np.quantile(numbers, 0.5)), 2), "p90": round(float(np.quantile(numbers, 0.9)), 2),
            "max": round(numbers[-1], 2)}


async def measure_noise(utterances: list[Utterance], judges: Judges, vad_path: Path, *,
                        enhancers: bool = True) -> dict[str, Any]:
    """WER of the noisy set as heard, and after each noise reduction (`enhancers`); and how often the noise alone
    (the trailing seconds after the speech) would barge in."""
    noisy = [u for u in utterances if u.kind == "noisy"]
    report: dict[str, Any] = {}
    settings: tuple[NoiseReduction | Literal["none", "clean speech"], ...] = (
        ("none", "near_field", "far_field", "clean speech") if enhancers else ("none", "clean speech"))
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
            after = Utterance(u.kind, u.voice, "", pcm, u.speech_end)
            false_barge_ins += stops_a_reply(after, vad_path, (u.speech_end + RATE // 5, len(pcm)))
        report[setting] = {"wer": round(errors / words, 3), "words": words,
                           "noise_alone_barges_in_pct": _pct(false_barge_ins, len(noisy))}
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


def voices() -> dict[str, Any]:
    """The set's voices by name: Piper (the output voice) and espeak-ng's; the human recordings are "human"."""
    from benchmarks.turn_taking_set import ESPEAK_VOICES
    from benchmarks.voice_audio import Speaker

    found: dict[str, Any] = {PIPER: Speaker}
    found.update({voice.name: voice for voice in ESPEAK_VOICES})
    return found


def _summary(per_voice: dict[str, dict[str, Any]], names: list[str]) -> dict[str, Any]:
    """The figures over several voices: the mean of each voice's (a voice without such utterances left out)."""
    def mean(path: tuple[str, ...]) -> float | None:
        values = []
        for name in names:
            node: Any = per_voice[name]
            for key in path:
                node = node.get(key) if isinstance(node, dict) else None
            if isinstance(node, (int, float)):
                values.append(float(node))
        return round(sum(values) / len(values), 1) if values else None

    out: dict[str, Any] = {"voices": names}
    for detector in DETECTORS:
        out[detector] = {key: mean(("turn_end", detector, key)) for key in
                         ("ended_too_early_pct", "complete_ended_inside_pct", "complete_ended_within_300_ms_pct")}
        out[detector]["end_of_turn_delay_p50_ms"] = mean(("turn_end", detector, "end_of_turn_delay_ms", "p50"))
    out["paused_reply"] = {key: mean(("replies", "paused", key)) for key in
                           ("backchannels_that_stopped_the_reply_pct", "interruptions_that_did_not_pct")}
    out["paused_reply"]["backchannel_pause_p95_ms"] = mean(("replies", "paused", "backchannel_pause_ms", "p95"))
    out["paused_reply"]["decided_after_speech_end_p95_ms"] = mean(("replies", "paused", "decided_after_speech_end_ms",
                                                                   "p95"))
    out["noise_wer"] = mean(("noise", "none", "wer"))
    out["clean_wer"] = mean(("noise", "clean speech", "wer"))
    return out


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    from gateway.platform.config import default_cache_dir
    from inference.asr import AsrEngine
    from inference.llm.end_of_turn import EndOfTurnModel
    from inference.llm.engine import LLMEngine
    from inference.llm.loader import load_lm
    from inference.models import embedded_asr, embedded_llm, embedded_turn_model, silero_vad_path
    from inference.turn_end import TurnEndModel
    known = voices()
    wanted = [name for name in args.voices.split(",") if name] if args.voices else [*known, HUMAN]
    unknown = [name for name in wanted if name not in known and name != HUMAN]
    if unknown:
        raise SystemExit(f"unknown voices {unknown}; known: {[*known, HUMAN]}")
    vad_path = silero_vad_path()
    asr = AsrEngine.load(args.asr_model or embedded_asr(), threads=1)
    audio = TurnEndModel.load(embedded_turn_model())
    lm = await asyncio.to_thread(load_lm, embedded_llm(), cache_dir=default_cache_dir())
    engine = LLMEngine(lm)
    engine.start()
    per_voice: dict[str, dict[str, Any]] = {}
    logprobs: dict[str, dict[str, list[Any]]] = {}
    missing: list[str] = []
    try:
        judges = Judges(asr=asr, audio=audio, text=EndOfTurnModel(engine))
        for name in wanted:
            if name == HUMAN:
                humans, missing = recordings(seed=args.seed)
                groups: dict[str, list[Utterance]] = {}
                for u in humans:
                    groups.setdefault(u.voice, []).append(u)
            else:
                speaker = known[name]() if name == PIPER else known[name]
                groups = {name: build(speaker, seed=args.seed)}
                if name == PIPER:
                    speaker.close()
            for voice, utterances in groups.items():
                started = time.perf_counter()
                counts = {kind: sum(u.kind == kind for u in utterances) for kind in
                          ("complete", "paused", "backchannel", "interruption", "noisy")}
                report: dict[str, Any] = {"utterances": counts}
                report["turn_end"] = await measure_detectors(
                    utterances, args.eagerness, judges, vad_path,
                    DETECTORS if counts["paused"] or counts["complete"] else ())
                if counts["backchannel"] or counts["interruption"]:
                    report["replies"] = await measure_replies(utterances, judges, vad_path)
                report["noise"] = await measure_noise(utterances, judges, vad_path,
                                                      enhancers=args.enhancers and voice == PIPER)
                logprobs[voice] = await confidences(utterances, judges)
                report["avg_logprob"] = {kind: _quantiles(values) for kind, values in logprobs[voice].items()
                                         if not kind.endswith("_heard")}
                report["seconds"] = round(time.perf_counter() - started, 1)
                per_voice[voice] = report
                print(json.dumps({"voice": voice, "done_in_s": report["seconds"]}), file=sys.stderr)
    finally:
        engine.close()
        asr.close()
        audio.close()
    others = [name for name in per_voice if name != PIPER]
    return {
        "cpu": _cpu_name(),
        "asr_model": str(args.asr_model or "tiny.en (embedded)"),
        "eagerness": args.eagerness,
        "missing": missing,
        "overall": _summary(per_voice, list(per_voice)),
        "voices_other_than_the_output_voice": _summary(per_voice, others),
        "calibration": calibrate(logprobs, exclude=PIPER),
        "per_voice": per_voice,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--eagerness", default="auto", choices=("low", "medium", "high", "auto"))
    parser.add_argument("--seed", type=int, default=0, help="the noise's and the coughs' random seed")
    parser.add_argument("--voices", help=f"comma-separated: {PIPER}, espeak:VOICE@SPEED as in "
                        f"turn_taking_set.ESPEAK_VOICES, {HUMAN} (default: all)")
    parser.add_argument("--asr-model", type=Path, help="a faster-whisper model folder (default: the embedded tiny.en)")
    parser.add_argument("--enhancers", action=argparse.BooleanOptionalAction, default=True,
                        help="also measure the noise reduction settings (on Piper's noisy set)")
    parser.add_argument("--out", type=Path, help="also write the JSON report here")
    args = parser.parse_args(argv)
    report = asyncio.run(main_async(args))
    text = json.dumps(report, indent=1)
    print(text)
    if args.out is not None:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
