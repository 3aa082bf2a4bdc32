"""Which Silero file hears a phone caller: the VAD's two models on the turn-taking set's voices, wideband and as a
phone call brings them (16 kHz down to 8 kHz, G.711 mu-law, back up to 16 kHz with the resampler the SIP and
Twilio transports use).

For each utterance the VAD runs from a fresh state, with server_vad's default settings (threshold 0.5, 300 ms
padding, 500 ms of silence); an utterance is heard when speech starts before its speech has ended. Coughs are left
out (not speech); every other kind is something a caller says. Printed as JSON, per voice and overall:

    python -m benchmarks.vad_narrowband [--voices NAME,...] [--out FILE]

`heard` is the share of utterances whose speech the VAD started on; `voiced_s` the seconds of windows at or above
the threshold over every utterance's speech (more is more of the speech heard); `us_per_window` the model's cost.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.asr_models import cpu_info
from benchmarks.turn_taking import utterances_of, wanted_voices
from benchmarks.turn_taking_set import RATE, Utterance, missing_source
from media.codecs import ulaw_decode, ulaw_encode
from media.frames import AudioChunk
from media.resample import Resampler
from media.vad import WINDOW_MS, WINDOW_SAMPLES, SileroVad, StreamingVad, VadSettings, VadSpeechStarted

PHONE_RATE = 8000


def phone_band(pcm: np.ndarray) -> np.ndarray:
    """What a phone call delivers of `pcm` (16 kHz): G.711 mu-law at 8 kHz, brought back up to 16 kHz as the
    gateway's phone transports do (soxr LQ)."""
    down = Resampler(RATE, PHONE_RATE, quality="HQ")
    narrow = np.concatenate([down.process(pcm), down.flush()])
    line = ulaw_decode(ulaw_encode(narrow))
    up = Resampler(PHONE_RATE, RATE, quality="LQ")
    return np.concatenate([up.process(line), up.flush()])


def listen(model: SileroVad, pcm: np.ndarray, speech_end: int) -> tuple[bool, float, int]:
    """(speech started before the speech ended, voiced seconds within the speech, windows scored)."""
    vad = StreamingVad(model, VadSettings())
    vad.reset()
    heard = False
    end_ms = 1000.0 * speech_end / RATE
    for start in range(0, pcm.size, 320):  # 20 ms chunks, as a call's packets come
        events = vad.process(AudioChunk(pcm[start:start + 320], RATE))
        heard = heard or any(isinstance(event, VadSpeechStarted) and event.audio_start_ms <= end_ms for event in events)
    windows = int(vad.position_ms / WINDOW_MS)
    model.reset()  # the same model again, window by window, for the voiced time within the speech
    scored = pcm[: speech_end - speech_end % WINDOW_SAMPLES].astype(np.float32) / 32768
    voiced = sum(model.probability(window) >= VadSettings().threshold
                 for window in scored.reshape(-1, WINDOW_SAMPLES))
    return heard, voiced * WINDOW_MS / 1000, windows + scored.size // WINDOW_SAMPLES

def measure(utterances: list[Utterance], models: dict[str, SileroVad]) -> dict[str, dict[str, Any]]:
    spoken = [u for u in utterances if u.text]  # coughs are not speech
    bands = {"wideband": [u.pcm for u in spoken], "phone": [phone_band(u.pcm) for u in spoken]}
    out: dict[str, dict[str, Any]] = {}
    for model_name, model in models.items():
        for band, clips in bands.items():
            heard = 0
            voiced = 0.0
            windows = 0
            began = time.perf_counter()
            for utterance, pcm in zip(spoken, clips, strict=True):
                was_heard, seconds, scored = listen(model, pcm, utterance.speech_end)
                heard += was_heard
                voiced += seconds
                windows += scored
            out[f"{model_name} {band}"] = {
                "utterances": len(spoken), "heard": round(heard / len(spoken), 3), "voiced_s": round(voiced, 2),
                "us_per_window": round(1e6 * (time.perf_counter() - began) / max(windows, 1), 1)}
    return out


def overall(per_voice: dict[str, dict[str, dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    keys = next(iter(per_voice.values())).keys() if per_voice else []
    out = {}
    for key in keys:
        rows = [figures[key] for figures in per_voice.values()]
        count = sum(row["utterances"] for row in rows)
        out[key] = {"utterances": count,
                    "heard": round(sum(row["heard"] * row["utterances"] for row in rows) / count, 3),
                    "voiced_s": round(sum(row["voiced_s"] for row in rows), 2),
                    "heard_worst_voice": min(row["heard"] for row in rows)}
    return out


def main(argv: list[str] | None = None) -> None:
    from inference.models import narrowband_vad_path, silero_vad_path

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--voices", help="comma-separated voice names of the turn-taking set (default: all)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, help="also write the JSON here")
    args = parser.parse_args(argv)
    models = {"v6 (faster-whisper)": SileroVad(silero_vad_path()), "6.2.3 (silero-vad)": SileroVad(narrowband_vad_path())}
    wanted = wanted_voices(args.voices)
    missing = [f"{name} ({why})" for name in wanted if (why := missing_source(name)) is not None]
    per_voice = {name: measure(utterances_of(name, args.seed), models)
                 for name in wanted if missing_source(name) is None}
    report = {"benchmark": "vad_narrowband", "cpu": cpu_info(), "overall": overall(per_voice),
              "per_voice": per_voice, "missing_voices": missing}
    text = json.dumps(report, indent=2)
    print(text)
    if args.out is not None:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
