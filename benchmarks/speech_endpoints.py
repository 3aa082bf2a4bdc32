"""The speech endpoints' speed: POST /v1/audio/speech and POST /v1/audio/transcriptions, as a client sees them.

    python -m benchmarks.speech_endpoints [--runs 3] [--url http://127.0.0.1:8000 --api-key KEY]

Without --url it starts a gateway on a free port (the embedded Piper voice and Whisper tiny.en). Speech: a
paragraph of ~25 s in each format, streamed; the real-time factor is seconds of audio made per wall second, and
the time to the first byte is from the request to the first body bytes. Transcription: Piper's own speech
(a 5 s sentence and a 67 s file of 20 sentences, made by the speech endpoint first) as WAV, plain and streamed;
its real-time factor is seconds of audio per wall second. Live priority: a Realtime text turn answered in audio,
the time from response.created to its first audio delta, alone and while 3 speech requests stream a long text
each. Prints one JSON object, with the CPU it ran on.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import os
import statistics
import subprocess
import tempfile
import time
import wave
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import websockets

from benchmarks.int4_kernels import cpu_model
from gateway.platform.processes import GatewayProcess
from media.audio_files import decode_file

PARAGRAPH = (
    "The museum opens at nine in the morning, and the first tours leave from the main hall. Visitors can rent an "
    "audio guide at the desk, or download the guide to their own phone. The east wing holds paintings from the "
    "last two centuries, while the west wing shows tools, maps and instruments. Please keep your bags in the "
    "lockers downstairs, and remember that the café closes an hour before the museum does."
)
SENTENCE = "Please call me back tomorrow morning, after the meeting with the bank."
LONG = [
    "The museum opens at nine in the morning.", "Our train was delayed by heavy snow.",
    "She planted tomatoes and beans in the garden.", "The library has a new collection of maps.",
    "Please turn off the lights when you leave.", "He repaired the old bicycle in the garage.",
    "The children painted a picture of the ocean.", "We bought fresh bread at the bakery.",
    "The meeting was moved to Thursday afternoon.", "A small boat sailed across the quiet lake.",
    "My sister is learning to play the violin.", "The restaurant serves soup with warm rolls.",
    "Bring an umbrella because it might rain.", "The doctor asked him to drink more water.",
    "They walked along the river after dinner.", "The printer on the second floor is broken.",
    "Winter evenings are long and very cold.", "The farmer sold apples at the market.",
    "I forgot my keys on the kitchen table.", "The concert ended with a loud round of applause.",
]
PCM_RATE = 24000
LIVE_QUESTION = "What is the capital of France?"


def lscpu_model() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return cpu_model()
    return next((line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Model name")),
                cpu_model())


def speak(http: httpx.Client, text: str, fmt: str) -> dict[str, Any]:
    started = time.perf_counter()
    first = None
    chunks: list[bytes] = []
    with http.stream("POST", "/v1/audio/speech", json={"model": "tts-1", "voice": "alloy", "input": text,
                                                       "response_format": fmt}) as response:
        response.raise_for_status()
        for chunk in response.iter_bytes():
            if first is None and chunk:
                first = time.perf_counter() - started
            chunks.append(chunk)
    wall = time.perf_counter() - started
    data = b"".join(chunks)
    audio_s = len(data) / 2 / PCM_RATE if fmt == "pcm" else decode_file(data, max_seconds=600).shape[0] / 16000
    return {"audio_s": audio_s, "wall_s": wall, "ttfb_s": first or wall, "bytes": len(data)}


def transcribe(http: httpx.Client, wav: bytes, *, stream: bool) -> dict[str, Any]:
    started = time.perf_counter()
    first = None
    data = {"model": "whisper-1", "response_format": "json", **({"stream": "true"} if stream else {})}
    with http.stream("POST", "/v1/audio/transcriptions", data=data, files={"file": ("speech.wav", wav)}) as response:
        response.raise_for_status()
        body = b""
        for chunk in response.iter_bytes():
            if first is None and chunk:
                first = time.perf_counter() - started
            body += chunk
    wall = time.perf_counter() - started
    if stream:
        events = [json.loads(line[6:]) for line in body.decode().splitlines() if line.startswith("data: ")]
        text = events[-1]["text"]
    else:
        text = json.loads(body)["text"]
    return {"wall_s": wall, "first_event_s": first if stream else None, "words": len(text.split())}


def wav_of(pcm: np.ndarray, rate: int) -> bytes:
    out = io.BytesIO()
    with wave.open(out, "wb") as f:
        f.setnchannels(1)
        f.setsampwidth(2)
        f.setframerate(rate)
        f.writeframes(pcm.astype("<i2").tobytes())
    return out.getvalue()


def spoken(http: httpx.Client, sentences: list[str]) -> tuple[bytes, float]:
    """The sentences as the speech endpoint says them, 0.6 s apart, as a 24 kHz WAV, and its length."""
    gap = np.zeros(int(0.6 * PCM_RATE), np.int16)
    parts = []
    for sentence in sentences:
        response = http.post("/v1/audio/speech", json={"model": "tts-1", "voice": "alloy", "input": sentence,
                                                      "response_format": "pcm"})
        response.raise_for_status()
        parts += [np.frombuffer(response.content, dtype="<i2").astype(np.int16), gap]
    pcm = np.concatenate(parts)
    return wav_of(pcm, PCM_RATE), len(pcm) / PCM_RATE


def summary(runs: list[dict[str, Any]], audio_s: float | None = None) -> dict[str, Any]:
    walls = [run["wall_s"] for run in runs]
    audio = audio_s if audio_s is not None else statistics.median(run["audio_s"] for run in runs)
    out: dict[str, Any] = {"audio_s": round(audio, 2), "wall_s_median": round(statistics.median(walls), 3),
                           "rtf_median": round(audio / statistics.median(walls), 1),
                           "rtf_runs": [round((audio_s or run["audio_s"]) / run["wall_s"], 1) for run in runs]}
    if "ttfb_s" in runs[0]:
        out["ttfb_s_median"] = round(statistics.median(run["ttfb_s"] for run in runs), 3)
        out["ttfb_s_runs"] = [round(run["ttfb_s"], 3) for run in runs]
    if runs[0].get("first_event_s") is not None:
        out["first_event_s_median"] = round(statistics.median(run["first_event_s"] for run in runs), 3)
    return out


async def live_first_audio(ws_url: str, headers: dict[str, str]) -> float:
    """A Realtime text turn answered in audio: seconds from response.created to its first audio delta."""
    async with websockets.connect(f"{ws_url}/v1/realtime", additional_headers=headers, max_size=None) as ws:
        async def until(kind: str) -> float:
            while json.loads(await asyncio.wait_for(ws.recv(), 60))["type"] != kind:
                pass
            return time.perf_counter()

        await until("session.created")
        await ws.send(json.dumps({"type": "conversation.item.create", "item": {
            "type": "message", "role": "user", "content": [{"type": "input_text", "text": LIVE_QUESTION}]}}))
        await ws.send(json.dumps({"type": "response.create", "response": {"output_modalities": ["audio"]}}))
        created = await until("response.created")
        first_audio = await until("response.output_audio.delta")
        await until("response.done")
        return first_audio - created


async def live_under_speech_load(url: str, headers: dict[str, str], runs: int, streams: int) -> dict[str, Any]:
    """Live turns alone and while `streams` speech requests stream a long text each: the live hops go first."""
    ws_url = url.replace("http", "ws", 1)
    alone, loaded = [], []
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=300) as http:
        async def drain() -> None:
            async with http.stream("POST", "/v1/audio/speech", json={"model": "tts-1", "voice": "alloy",
                                                                    "input": PARAGRAPH * 2, "response_format": "pcm"}) as r:
                async for _ in r.aiter_bytes():
                    pass

        await live_first_audio(ws_url, headers)  # warm up
        for _ in range(runs):
            alone.append(await live_first_audio(ws_url, headers))
            background = [asyncio.create_task(drain()) for _ in range(streams)]
            await asyncio.sleep(0.5)  # the speech requests are synthesizing
            loaded.append(await live_first_audio(ws_url, headers))
            still_streaming = sum(not task.done() for task in background)
            await asyncio.gather(*background)
            assert still_streaming == streams, "the speech requests ended before the live turn did"
    return {"speech_requests": streams, "alone_s": [round(x, 3) for x in alone],
            "alone_s_median": round(statistics.median(alone), 3), "loaded_s": [round(x, 3) for x in loaded],
            "loaded_s_median": round(statistics.median(loaded), 3)}


def measure(http: httpx.Client, runs: int, headers: dict[str, str]) -> dict[str, Any]:
    speak(http, "Warm up.", "pcm")
    speech = {fmt: summary([speak(http, PARAGRAPH, fmt) for _ in range(runs)]) for fmt in ("pcm", "mp3", "opus", "wav")}
    short_wav, short_s = spoken(http, [SENTENCE])
    long_wav, long_s = spoken(http, LONG)
    transcription = {
        "short_json": summary([transcribe(http, short_wav, stream=False) for _ in range(runs)], short_s),
        "long_json": summary([transcribe(http, long_wav, stream=False) for _ in range(runs)], long_s),
        "long_stream": summary([transcribe(http, long_wav, stream=True) for _ in range(runs)], long_s),
    }
    live = asyncio.run(live_under_speech_load(str(http.base_url).rstrip("/"), headers, runs, streams=3))
    return {"speech": speech, "transcription": transcription, "live_first_audio": live}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--url", help="a running gateway (default: start one)")
    parser.add_argument("--api-key", default="unused")
    args = parser.parse_args(argv)
    result: dict[str, Any] = {"cpu": lscpu_model(), "cpus": os.cpu_count(), "runs": args.runs}
    headers = {"authorization": f"Bearer {args.api_key}"}
    if args.url:
        with httpx.Client(base_url=args.url, headers=headers, timeout=300) as http:
            result.update(measure(http, args.runs, headers))
    else:
        with tempfile.TemporaryDirectory() as tmp:
            gateway = GatewayProcess(Path(tmp) / "gateway.log", args=["--data-dir", tmp]).start()
            try:
                gateway.wait_ready(300)
                with httpx.Client(base_url=gateway.url, headers=headers, timeout=300) as http:
                    result.update(measure(http, args.runs, headers))
            finally:
                gateway.stop()
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
