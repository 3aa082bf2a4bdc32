"""The embedded Whisper models against each other: word error rate and the CPU a final transcript costs a turn.

    python -m benchmarks.asr_models [--models tiny.en,base,base:en] [--threads 1] [--out FILE]

Each turn is what a session's final transcript decodes (AsrEngine.transcribe(..., final=True), as the gateway
calls it, on an engine loaded as the gateway loads it: --asr-threads 1, the 15 s window, beam 1): 0.3 s before
the speech, the utterance, 0.5 s after it. The utterances are benchmarks/turn_taking_set.py's COMPLETE sentences,
spoken by Piper (the gateway's own voice) and by espeak-ng's voices en-us, en-gb, en-gb-scotland, en-us+f3 and
en-us+m7 at 150 and 190 words a minute, each clean and mixed with noise (babble of the same voice reversed, pink,
white, in turn) at 5 dB SNR over the speech; and people: Debian alsa-utils' recordings (/usr/share/sounds/alsa,
"Front, center" ...) and useful-moonshine-onnx's reading, where installed, the same way.

Models: `tiny.en` (the default), `base` as the gateway runs it (--asr-model base: no language is set, so each call
detects it and decodes a full 30 s window), and `base:en`, Whisper base told the language is English (the 15 s
window; what a session naming "en" would cost if the session's language reached the decoder, which it does not
today). The engines are loaded side by side and take each turn in turn, so a busy host slows them alike.

core_s: the process's CPU seconds over the call (time.process_time; nothing else runs meanwhile). CTranslate2
decodes on threads of its own, so the ASR worker thread's own CPU time (thread_cpu_s) is only the feature
extraction and the Python around it. wall_s: the call's wall time. WER: word-level edits over reference words,
after lowercasing, dropping punctuation and writing numbers up to twenty as words; runaway_turns counts the decodes
that ran on past the words (more than twice the reference's words and 4: a phrase repeated to the token budget).
Prints one JSON object with the CPU it ran on (timings are this host's: name it when you quote one).

Measured (AMD EPYC, family 25 model 17: Zen 4 with AVX512-VNNI, 2 vCPUs shared with other work, load average 4-7;
286 turns a model, 2.8 s of audio a turn, --threads 1):

| model | WER | clean | noisy | runaways | core-s a turn (p50 / p90) | wall s a turn |
| --- | --- | --- | --- | --- | --- | --- |
| tiny.en | 0.318 | 0.140 | 0.496 | 0 | 0.218 (0.214 / 0.247) | 0.287 |
| base (as the gateway runs it) | 0.548 | 0.142 | 0.954 | 2 | 2.019 (1.970 / 2.211) | 2.591 |
| base:en | 0.335 | 0.143 | 0.526 | 0 | 0.398 (0.394 / 0.448) | 0.523 |

Whisper base hears these English voices no better than tiny.en, and as the gateway runs it (no language: a
detection and a full 30 s window every call) it takes 9 times the CPU, and its two runaway decodes over noise
repeated a phrase to the token budget: tiny.en stays the default, base is for other languages and translation.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.turn_taking import edit_distance
from benchmarks.turn_taking_set import COMPLETE, beckett_path, read_wav
from benchmarks.voice_audio import Speaker, speech_span
from benchmarks.voices import EspeakSpeaker, espeak_available

RATE = 16000
LEAD_S, TRAIL_S = 0.3, 0.5  # around the speech, as a committed turn's audio has (prefix padding, silence)
SNR_DB = 5.0
NOISES = ("babble", "pink", "white")
ESPEAK_VOICES = ("en-us", "en-gb", "en-gb-scotland", "en-us+f3", "en-us+m7")
ESPEAK_SPEEDS = (150, 190)
ALSA_SOUNDS = Path("/usr/share/sounds/alsa")
ALSA_CLIPS = {"Front_Center": "Front center.", "Front_Left": "Front left.", "Front_Right": "Front right.",
              "Rear_Center": "Rear center.", "Rear_Left": "Rear left.", "Rear_Right": "Rear right.",
              "Side_Left": "Side left.", "Side_Right": "Side right."}
BECKETT_PARTS = ((0.0, 2.80, "Ever tried, ever failed."), (2.95, 5.60, "No matter, try again."),
                 (6.55, 9.96, "Fail again, fail better."))
NUMBERS = ("zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen "
           "seventeen eighteen nineteen twenty").split()
SPELLINGS = {"centre": "center", "ok": "okay"}


@dataclass(frozen=True)
class Turn:
    voice: str
    condition: str  # clean, or the noise's kind
    text: str
    audio: np.ndarray  # float32 at RATE


def words(text: str) -> list[str]:
    text = re.sub(r"[^a-z0-9' ]", " ", text.lower().replace("-", " "))
    out = []
    for word in text.split():
        word = word.strip("'")
        if word.isdigit() and int(word) < len(NUMBERS):
            word = NUMBERS[int(word)]
        if word:
            out.append(SPELLINGS.get(word, word))
    return out


def word_errors(reference: str, hypothesis: str) -> tuple[int, int]:
    """(edits, reference words), with this benchmark's spellings (`words`)."""
    ref = words(reference)
    return edit_distance(ref, words(hypothesis)), len(ref)


def _noise(kind: str, n: int, rng: np.random.Generator, voices: list[np.ndarray]) -> np.ndarray:
    """As benchmarks/turn_taking_set.py's: white, pink, or six talkers reversed so that no word is understood."""
    if kind == "white":
        return rng.standard_normal(n)
    if kind == "pink":
        spectrum = np.fft.rfft(rng.standard_normal(n))
        spectrum /= np.sqrt(np.maximum(np.arange(len(spectrum)), 1))
        return np.fft.irfft(spectrum, n)
    babble = np.zeros(n)
    for _ in range(6):
        voice = voices[int(rng.integers(len(voices)))].astype(np.float64)[::-1]
        babble += np.roll(np.resize(voice, n), int(rng.integers(n)))
    return babble


def _framed(pcm: np.ndarray) -> np.ndarray:
    """The speech with LEAD_S before and TRAIL_S after it (int16)."""
    onset, end = speech_span(pcm, RATE)
    if end <= onset:
        onset, end = 0, len(pcm)
    return np.concatenate([np.zeros(int(LEAD_S * RATE), np.int16), pcm[onset:end], np.zeros(int(TRAIL_S * RATE), np.int16)])


def _turns(voice: str, said: list[tuple[str, np.ndarray]], rng: np.random.Generator) -> list[Turn]:
    """Each clip clean, and again mixed with one of the noises (in turn) at SNR_DB over its speech."""
    framed = [(text, _framed(pcm)) for text, pcm in said]
    out = [Turn(voice, "clean", text, pcm.astype(np.float32) / 32768.0) for text, pcm in framed]
    voices = [pcm for _, pcm in framed]
    for i, (text, pcm) in enumerate(framed):
        kind = NOISES[i % len(NOISES)]
        noise = _noise(kind, len(pcm), rng, voices)
        speech = pcm[int(LEAD_S * RATE):len(pcm) - int(TRAIL_S * RATE)].astype(np.float64)
        noise *= np.sqrt(np.mean(speech**2) / np.mean(noise**2) / 10 ** (SNR_DB / 10))
        noisy = np.clip(pcm + noise, -32768, 32767).astype(np.int16)
        out.append(Turn(voice, kind, text, noisy.astype(np.float32) / 32768.0))
    return out


def build_set(seed: int = 0, sentences: list[str] | None = None) -> tuple[list[Turn], list[str]]:
    """Every voice's turns, and a note for each voice that is missing here."""
    rng = np.random.default_rng(seed)
    sentences = sentences or COMPLETE
    turns: list[Turn] = []
    missing: list[str] = []
    piper = Speaker()
    try:
        turns += _turns("piper:joe", [(text, piper.say(text, RATE).pcm) for text in sentences], rng)
    finally:
        piper.close()
    if espeak_available():
        for voice in ESPEAK_VOICES:
            for speed in ESPEAK_SPEEDS:
                speaker = EspeakSpeaker(voice, speed)
                turns += _turns(speaker.name, [(text, speaker.say(text, RATE).pcm) for text in sentences], rng)
    else:
        missing.append("espeak-ng voices (apt-get install espeak-ng)")
    if all((ALSA_SOUNDS / f"{name}.wav").exists() for name in ALSA_CLIPS):
        turns += _turns("human:alsa-utils", [(text, read_wav(ALSA_SOUNDS / f"{name}.wav"))
                                             for name, text in ALSA_CLIPS.items()], rng)
    else:
        missing.append("human:alsa-utils (apt-get install alsa-utils)")
    beckett = beckett_path()
    if beckett is not None:
        reading = read_wav(beckett)
        turns += _turns("human:moonshine-beckett", [(text, reading[round(a * RATE):round(b * RATE)])
                                                    for a, b, text in BECKETT_PARTS], rng)
    else:
        missing.append("human:moonshine-beckett (pip install --no-deps useful-moonshine-onnx==20251121)")
    return turns, missing


def load_engine(choice: str, threads: int, partials: bool = False) -> Any:
    from gateway.platform.config import default_cache_dir
    from inference.asr import DEFAULT_PARTIAL_WINDOW_S, DEFAULT_WINDOW_S, AsrEngine
    from inference.models import resolve_asr_model

    choice, _, window = choice.partition("@")
    name, _, language = choice.partition(":")
    path = resolve_asr_model(name, cache_dir=default_cache_dir())
    # One worker: the turns are sequential, and the gateway's first worker is the one a lone final goes to.
    # name@W: the window of the calls measured (the partials' with --partials, else the finals').
    final_window = float(window) if window and not partials else DEFAULT_WINDOW_S
    partial_window = float(window) if window and partials else DEFAULT_PARTIAL_WINDOW_S
    return AsrEngine.load(path, "cpu", threads=threads, language=language or None, workers=1, partial_budget=64,
                          window_s=max(final_window, partial_window) if partials else final_window,
                          partial_window_s=partial_window)


def _summary(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {"mean": round(statistics.fmean(ordered), 4), "p50": round(statistics.median(ordered), 4),
            "p90": round(ordered[min(len(ordered) - 1, round(0.9 * (len(ordered) - 1)))], 4),
            "max": round(ordered[-1], 4)}


def _wer(rows: list[dict[str, Any]]) -> float | None:
    ref = sum(r["ref_words"] for r in rows)
    return round(sum(r["edits"] for r in rows) / ref, 4) if ref else None


def _runaway(row: dict[str, Any]) -> bool:
    """A decode that ran on past the words (a phrase repeated, a loop): twice the reference's words and more."""
    return len(words(row["heard"])) > 2 * row["ref_words"] + 4


def _group(rows: list[dict[str, Any]]) -> dict[str, Any]:
    return {"turns": len(rows), "wer": _wer(rows),
            "wer_clean": _wer([r for r in rows if r["condition"] == "clean"]),
            "wer_noisy": _wer([r for r in rows if r["condition"] != "clean"]),
            "runaway_turns": sum(map(_runaway, rows)),
            "dropped_partials": sum(r["dropped"] for r in rows),
            "core_s_per_turn": round(statistics.fmean(r["core_s"] for r in rows), 4),
            "wall_s_per_turn": round(statistics.fmean(r["wall_s"] for r in rows), 4)}


async def measure(engines: dict[str, Any], turns: list[Turn],
                  partials: float | None = None) -> dict[str, list[dict[str, Any]]]:
    """Each turn through each engine. `partials`: the first fraction of each turn's audio (mid-speech, as a partial
    hears it) as a partial transcript, its words held against the first engine's on the same audio."""
    loop = asyncio.get_running_loop()
    rows: dict[str, list[dict[str, Any]]] = {name: [] for name in engines}
    names = list(engines)
    for i, turn in enumerate(turns):
        audio = turn.audio[: round(len(turn.audio) * partials)] if partials else turn.audio
        heard: dict[str, str | None] = {}
        for name in names[i % len(names):] + names[:i % len(names)]:  # each model goes first in turn
            engine = engines[name]
            thread_before = await loop.run_in_executor(engine._executor, time.thread_time)
            cpu_before, wall_before = time.process_time(), time.perf_counter()
            transcript = await engine.transcribe(audio, final=not partials)
            wall, core = time.perf_counter() - wall_before, time.process_time() - cpu_before
            thread_cpu = await loop.run_in_executor(engine._executor, time.thread_time) - thread_before
            heard[name] = transcript.text if transcript is not None else None
            rows[name].append({"voice": turn.voice, "condition": turn.condition, "core_s": core, "wall_s": wall,
                               "thread_cpu_s": thread_cpu, "audio_s": len(audio) / RATE})
        reference = turn.text if not partials else heard[names[0]] or ""
        for name in names:
            text = heard[name]
            edits, ref = word_errors(reference, text or "")
            rows[name][-1].update({"text": reference, "heard": text or "", "dropped": text is None,
                                   "edits": edits, "ref_words": ref})
    return rows


def cpu_info() -> dict[str, Any]:
    fields: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                fields.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    lscpu: dict[str, str] = {}
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
        lscpu = {k.strip(): v.strip() for k, _, v in (line.partition(":") for line in out.splitlines())}
    except (OSError, subprocess.SubprocessError):
        pass
    flags = set(fields.get("flags", "").split())
    return {"model_name": fields.get("model name", "unknown"), "vendor": lscpu.get("Vendor ID"),
            "family": lscpu.get("CPU family"), "model": lscpu.get("Model"), "stepping": lscpu.get("Stepping"),
            "cpus": os.cpu_count(), "avx2": "avx2" in flags, "avx512_vnni": "avx512_vnni" in flags,
            "machine": platform.machine()}


def report(rows: dict[str, list[dict[str, Any]]], loads: dict[str, float], missing: list[str],
           threads: int, keep_turns: bool) -> dict[str, Any]:
    import ctranslate2
    import faster_whisper

    models: dict[str, Any] = {}
    for name, model_rows in rows.items():
        voices: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for row in model_rows:
            voices[row["voice"]].append(row)
        models[name] = {
            **_group(model_rows),
            "load_s": round(loads[name], 2),
            "core_s": _summary([r["core_s"] for r in model_rows]),
            "wall_s": _summary([r["wall_s"] for r in model_rows]),
            "thread_cpu_s_per_turn": round(statistics.fmean(r["thread_cpu_s"] for r in model_rows), 4),
            "core_s_per_audio_s": round(sum(r["core_s"] for r in model_rows) / sum(r["audio_s"] for r in model_rows), 4),
            # Without the runaway decodes, whose dozens of words would outweigh a voice's dozen sentences.
            "wer_without_runaways": _wer([r for r in model_rows if not _runaway(r)]),
            "per_condition": {condition: _group([r for r in model_rows if r["condition"] == condition])
                              for condition in ("clean", *NOISES)},
            "per_voice": {voice: _group(voice_rows) for voice, voice_rows in voices.items()},
        }
        if keep_turns:
            models[name]["turns_heard"] = [{k: r[k] for k in ("voice", "condition", "text", "heard", "edits")}
                                           for r in model_rows]
    first = next(iter(rows.values()))
    return {"cpu": cpu_info(), "python": sys.version.split()[0], "ctranslate2": ctranslate2.__version__,
            "faster_whisper": faster_whisper.__version__, "asr_threads": threads, "snr_db": SNR_DB,
            "turns_per_model": len(first), "voices": sorted({r["voice"] for r in first}),
            "audio_s_per_turn": round(statistics.fmean(r["audio_s"] for r in first), 3),
            "missing": missing, "models": models}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="tiny.en,base,base:en",
                        help="comma-separated: tiny.en, base, base:en (base told the language), or folder paths")
    parser.add_argument("--threads", type=int, default=1, help="CTranslate2 threads (the gateway's --asr-threads)")
    parser.add_argument("--sentences", type=int, default=0, help="only the first N sentences (0: all of COMPLETE)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--turns", action="store_true", help="also list what each model heard in each turn")
    parser.add_argument("--partials", type=float, metavar="FRACTION",
                        help="partial transcripts of each turn's first FRACTION (0.6: mid-speech) instead of finals; "
                        "the WER is then against the first model's words on the same audio, and a model name@W "
                        "sets the partials' window")
    parser.add_argument("--out", type=Path, help="also write the JSON here")
    args = parser.parse_args(argv)
    from inference.asr import import_ctranslate2

    import_ctranslate2(args.threads)  # OpenMP started at --threads, as the gateway starts it
    turns, missing = build_set(args.seed, COMPLETE[: args.sentences] if args.sentences else None)
    engines, loads = {}, {}
    for choice in args.models.split(","):
        started = time.perf_counter()
        engines[choice] = load_engine(choice, args.threads, partials=bool(args.partials))
        loads[choice] = time.perf_counter() - started
    try:
        rows = asyncio.run(measure(engines, turns, args.partials))
    finally:
        for engine in engines.values():
            engine.close()
    result = report(rows, loads, missing, args.threads, args.turns)
    text = json.dumps(result, indent=2)
    if args.out:
        args.out.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
