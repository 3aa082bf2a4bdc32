"""Per-stage voice costs with the embedded models; prints JSON.

    python -m benchmarks.voice_stages [--repeats 3] [--asr-threads 1] [--tts-threads 1]

Stages: Silero window cost, Whisper partials on a growing buffer and finals (beam 1 vs 5),
Piper load, first-chunk latency and real-time factor. Speech is made by Piper itself.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time

import numpy as np

from inference.asr import AsrEngine
from inference.models import embedded_asr, embedded_tts, silero_vad_path
from inference.tts import TtsEngine
from media.frames import AudioChunk
from media.resample import resample
from media.vad import WINDOW_SAMPLES, SileroVad

QUESTION = "What is the capital of France?"
LONG = (
    "The meeting moved to Thursday afternoon because the projector in the main room was broken. "
    "Please bring the quarterly figures, and remember that the budget review starts at three."
)
REPLY = (
    "Paris is the capital of France. It has been the seat of government for centuries, "
    "and it is also the largest city in the country."
)


def summary(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {
        "median": round(statistics.median(ordered), 4),
        "min": round(ordered[0], 4),
        "max": round(ordered[-1], 4),
        "n": len(ordered),
    }


def bench_vad(speech16k: np.ndarray, windows: int) -> dict[str, object]:
    vad = SileroVad(silero_vad_path())
    audio = AudioChunk(np.resize(speech16k, windows * WINDOW_SAMPLES), 16000).to_float32()
    costs = []
    for i in range(windows):
        t = time.perf_counter()
        vad.probability(audio[i * WINDOW_SAMPLES : (i + 1) * WINDOW_SAMPLES])
        costs.append((time.perf_counter() - t) * 1e3)
    costs.sort()
    return {"window_ms_of_audio": 32, "cost_ms": summary(costs), "p95_ms": round(costs[int(0.95 * len(costs))], 4)}


async def bench_asr(asr: AsrEngine, question16k: np.ndarray, long16k: np.ndarray, repeats: int) -> dict[str, object]:
    out: dict[str, object] = {"load_seconds": round(asr.load_seconds, 3)}
    q = AudioChunk(question16k, 16000).to_float32()
    partials: dict[str, list[float]] = {}
    for _ in range(repeats):
        for end_ms in (500, 1000, 1500, 2000):
            result = await asr.transcribe(q[: 16 * end_ms], final=False)
            assert result is not None
            partials.setdefault(f"{end_ms}ms", []).append(result.seconds)
    out["partial_seconds_by_audio_length"] = {k: summary(v) for k, v in partials.items()}
    for beam in (1, 5):
        asr.final_beam_size = beam
        for name, clip in (("question", question16k), ("long", long16k)):
            audio = AudioChunk(clip, 16000).to_float32()
            times, text = [], ""
            for _ in range(repeats):
                result = await asr.transcribe(audio, final=True)
                assert result is not None
                times.append(result.seconds)
                text = result.text
            out[f"final_beam{beam}_{name}"] = {
                "audio_s": round(clip.size / 16000, 2),
                "seconds": summary(times),
                "text": text,
            }
    asr.final_beam_size = 1
    return out


async def bench_tts(tts: TtsEngine, repeats: int) -> dict[str, object]:
    out: dict[str, object] = {"load_seconds": round(tts.load_seconds, 3)}
    for name, text in (("clause", "Sure, here it is,"), ("sentence", "Paris is the capital of France.")):
        firsts = []
        for _ in range(repeats):
            t = time.perf_counter()
            async for _pcm in tts.synthesize(text):
                firsts.append(time.perf_counter() - t)
                break
        out[f"first_chunk_seconds_{name}"] = summary(firsts)
    rtfs = []
    for _ in range(repeats):
        t = time.perf_counter()
        pcm = tts.synthesize_blocking(REPLY)
        rtfs.append((time.perf_counter() - t) / (pcm.size / tts.sample_rate))
    out["real_time_factor"] = summary(rtfs)
    return out


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--asr-threads", type=int, default=1)
    parser.add_argument("--tts-threads", type=int, default=1)
    parser.add_argument("--vad-windows", type=int, default=2000)
    args = parser.parse_args()

    tts = TtsEngine.load(embedded_tts(), threads=args.tts_threads)
    asr = AsrEngine.load(embedded_asr(), "cpu", threads=args.asr_threads)
    try:
        question16k = resample(tts.synthesize_blocking(QUESTION), tts.sample_rate, 16000)
        long16k = resample(tts.synthesize_blocking(LONG), tts.sample_rate, 16000)
        report = {
            "vad": bench_vad(question16k, args.vad_windows),
            "asr": await bench_asr(asr, question16k, long16k, args.repeats),
            "tts": await bench_tts(tts, args.repeats),
        }
    finally:
        asr.close()
        tts.close()
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    asyncio.run(main())
