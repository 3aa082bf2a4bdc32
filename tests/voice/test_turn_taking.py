"""Turn-taking with the real models: the audio end-of-turn model (Smart Turn v3) behind semantic_vad, and
noise_reduction (DeepFilterNet 3) before the VAD and Whisper."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from gateway.generation.runtime import Runtime
from gateway.platform.config import Settings
from gateway.protocol.session_config import AUDIO_TURN_THRESHOLDS
from gateway.realtime.session import RealtimeSession
from inference.asr import AsrEngine
from inference.models import ModelNotFound, embedded_turn_model
from inference.tts import TtsEngine
from inference.turn_end import TurnEndModel
from media.denoise import NoiseReducer
from media.resample import resample

RATE = 16000


@pytest.fixture(scope="module")
def turn_end() -> Iterator[TurnEndModel]:
    model = TurnEndModel.load(embedded_turn_model())
    yield model
    model.close()


def said(tts: TtsEngine, text: str, rate: int = RATE) -> np.ndarray:
    return resample(tts.synthesize_blocking(text), tts.sample_rate, rate)


def as_float(pcm: np.ndarray) -> np.ndarray:
    return pcm.astype(np.float32) / 32768.0


def with_pause(pcm: np.ndarray, pause_ms: int) -> np.ndarray:
    return np.concatenate([pcm, np.zeros(RATE * pause_ms // 1000, np.int16)])


async def test_the_audio_model_tells_a_finished_question_from_a_cut_off_phrase(
        turn_end: TurnEndModel, tts: TtsEngine) -> None:
    """Each on its side of the probability at which semantic_vad (auto) ends a turn early, with margin: 0.99 and
    0.015 on an Intel Xeon, AVX512 and AVX2 kernels alike, where the threshold is 0.5."""
    finished = await turn_end.probability(as_float(with_pause(said(tts, "What is the capital of France?"), 100)))
    cut_off = await turn_end.probability(as_float(with_pause(said(tts, "Hmm, let me think, I want"), 100)))
    assert finished >= AUDIO_TURN_THRESHOLDS["auto"] > cut_off, (finished, cut_off)


async def test_a_long_turn_is_judged_on_its_end(turn_end: TurnEndModel, tts: TtsEngine) -> None:
    """The model reads 8 s: a turn of 12 s is judged on its last 8, where it ends."""
    question = with_pause(said(tts, "What is the capital of France?"), 100)
    long_turn = np.concatenate([np.zeros(12 * RATE - len(question), np.int16), question])
    assert abs(await turn_end.probability(as_float(long_turn)) - await turn_end.probability(as_float(question))) < 0.05


def test_a_missing_end_of_turn_model_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ModelNotFound, match="end-of-turn model not found"):
        TurnEndModel.load(tmp_path / "none.onnx")


def test_noise_reduction_takes_noise_out_and_keeps_speech(tts: TtsEngine) -> None:
    rng = np.random.default_rng(1)
    noise = (rng.standard_normal(2 * RATE) * 2000).astype(np.int16)
    speech = said(tts, "What is the capital of France?")
    for kind in ("near_field", "far_field"):
        out = {}
        for name, pcm in (("noise", noise), ("speech", speech)):
            reducer = NoiseReducer(kind)
            try:
                out[name] = np.concatenate([reducer.process(pcm[i:i + 320]) for i in range(0, len(pcm), 320)])
            finally:
                reducer.close()
            assert abs(len(out[name]) - len(pcm)) < RATE // 10  # what lags behind is the model's lookahead
        noise_db = 20 * np.log10(out["noise"][RATE // 2:].std() / noise.std())
        speech_db = 20 * np.log10(out["speech"].std() / speech.std())
        assert noise_db < -6 and speech_db > -3, (kind, noise_db, speech_db)


def open_session(asr: AsrEngine, turn_end: TurnEndModel | None) -> tuple[RealtimeSession, Runtime]:
    settings = Settings(load_voice_models=False)
    runtime = Runtime(settings)
    runtime.asr = asr
    runtime.turn_end = turn_end  # no LLM here, as with --llm-backend: the audio model is the only judge
    session = RealtimeSession(runtime, settings, transport="websocket", speech_factory=None)
    session.start()
    return session, runtime


def stop_executors(runtime: Runtime) -> None:
    """Not runtime.close(): the models are the test session's fixtures."""
    runtime.vad_executor.shutdown()
    runtime.denoise_executor.shutdown()


async def append(session: RealtimeSession, pcm24k: np.ndarray, seconds_per_append: float = 0.02) -> None:
    """In 20 ms appends, one every `seconds_per_append` (real time by default)."""
    for i in range(0, len(pcm24k), 480):
        await session.receive(json.dumps({"type": "input_audio_buffer.append",
                                          "audio": base64.b64encode(pcm24k[i:i + 480].tobytes()).decode()}))
        await asyncio.sleep(seconds_per_append)


async def stream(session: RealtimeSession, pcm24k: np.ndarray) -> None:
    """In 20 ms appends, in real time: the turn's silence is judged while it runs."""
    await append(session, pcm24k)
    await heard(session)


async def heard(session: RealtimeSession) -> None:
    """Once the VAD has taken in all the audio appended."""
    assert session.voice is not None
    await session.voice._drain_queue()
    await asyncio.sleep(0.2)  # the last window's VAD run


async def event_types(session: RealtimeSession) -> list[str]:
    """The events sent so far."""
    reader = session.outbox.attach()
    types = []
    while True:
        try:
            wire = await asyncio.wait_for(reader.next(), 0.2)
        except TimeoutError:
            return types
        if wire is None:
            return types
        types.append(json.loads(wire)["type"])


@pytest.mark.parametrize("with_model", [True, False], ids=["audio-model", "no-judge"])
async def test_semantic_vad_ends_a_finished_question_by_its_sound(
        asr: AsrEngine, tts: TtsEngine, turn_end: TurnEndModel, with_model: bool) -> None:
    """Without the LLM (--llm-backend), semantic_vad still ends a finished question after a short silence: the
    audio model heard it finished. With no judge at all it waits its longest silence (2 s for `auto`)."""
    session, runtime = open_session(asr, turn_end if with_model else None)
    try:
        await session.receive(json.dumps({"type": "session.update", "session": {
            "output_modalities": ["text"], "audio": {"input": {"turn_detection": {
                "type": "semantic_vad", "eagerness": "auto", "create_response": False}}}}}))
        question = said(tts, "What is the capital of France?", 24000)
        await append(session, np.concatenate([np.zeros(24000 // 4, np.int16), question]))
        # The VAD counts the silence in samples, the judge answers in wall time (0.02-0.13 s into the silence on
        # an Intel Xeon, 2 vCPU): 1.5 s of silence, under auto's longest wait, sent at a quarter of real time, so
        # that the judge has 6 s to answer in, and a machine 5x slower or busy still hears the turn end.
        await append(session, np.zeros(24000 * 3 // 2, np.int16), seconds_per_append=0.08)
        await heard(session)
        ended = (await event_types(session)).count("input_audio_buffer.speech_stopped")
        assert ended == (1 if with_model else 0)
    finally:
        await session.close()
        stop_executors(runtime)


async def test_noise_reduction_cleans_what_the_vad_and_whisper_hear(asr: AsrEngine) -> None:
    """noise_reduction: the session's audio buffer (what Whisper transcribes; the VAD hears the same) is the
    enhanced audio; null again, it is the audio as sent."""
    session, runtime = open_session(asr, None)
    noise = (np.random.default_rng(2).standard_normal(24000) * 2000).astype(np.int16)
    heard = {}
    try:
        for setting in ({"type": "near_field"}, None):
            await session.receive(json.dumps({"type": "session.update", "session": {"audio": {"input": {
                "turn_detection": None, "noise_reduction": setting}}}}))
            await session.receive(json.dumps({"type": "input_audio_buffer.clear"}))
            await stream(session, noise)
            assert session.voice is not None
            buffered = session.voice.buffer.slice(session.voice.buffer.start, session.voice.buffer.end)
            heard[json.dumps(setting)] = buffered[RATE // 2:].std()
        reduced, as_sent = heard['{"type": "near_field"}'], heard["null"]
        assert 20 * np.log10(reduced / as_sent) < -6, heard
    finally:
        await session.close()
        stop_executors(runtime)
