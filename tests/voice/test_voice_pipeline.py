"""Piper speech -> VAD -> Whisper, with the real models."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator

import numpy as np
import pytest

import inference.asr
from inference.asr import AsrEngine, TranscriptStabilizer
from inference.models import embedded_tts
from inference.tts import TtsEngine
from media.frames import AudioChunk
from media.resample import resample
from media.vad import SileroVad, StreamingVad, VadSettings, VadSpeechStarted, VadSpeechStopped
from tests.conftest import QUESTION
from tests.integration.speech import HEARD_AS_SAID, heard_as, heard_within, words


async def collect(chunks: AsyncIterator[np.ndarray]) -> np.ndarray:
    return np.concatenate([pcm async for pcm in chunks])

LEAD_MS = 1000
TRAIL_MS = 1200


def heard_the_question(text: str) -> bool:
    """Whisper heard the question, give or take a word (which word it mishears depends on the CPU)."""
    return heard_as(text, QUESTION) >= HEARD_AS_SAID


def with_silence(pcm16k: np.ndarray) -> np.ndarray:
    lead = np.zeros(16 * LEAD_MS, dtype=np.int16)
    trail = np.zeros(16 * TRAIL_MS, dtype=np.int16)
    return np.concatenate([lead, pcm16k, trail])


def speech_bounds_ms(pcm16k: np.ndarray) -> tuple[float, float]:
    """Where the synthetic speech really is: first and last sample above ~-40 dBFS."""
    loud = np.nonzero(np.abs(pcm16k.astype(np.int32)) > 300)[0]
    return 1000 * loud[0] / 16000, 1000 * loud[-1] / 16000


def run_vad(vad: StreamingVad, audio: np.ndarray) -> list[object]:
    events: list[object] = []
    for i in range(0, audio.size, 320):  # 20 ms chunks, as the inbound reader delivers them
        events += vad.process(AudioChunk(audio[i : i + 320], 16000))
    return events


async def test_vad_finds_one_turn_and_whisper_transcribes_it(silero: SileroVad, asr: AsrEngine, question_16k: np.ndarray) -> None:
    audio = with_silence(question_16k)
    vad = StreamingVad(silero, VadSettings(silence_duration_ms=500))
    events = await asyncio.to_thread(run_vad, vad, audio)
    assert [type(e) for e in events] == [VadSpeechStarted, VadSpeechStopped], events
    started, stopped = events
    onset, offset = speech_bounds_ms(audio)
    assert abs(started.audio_start_ms - onset) <= 100
    assert abs(stopped.audio_end_ms - offset) <= 150
    assert stopped.detected_ms - stopped.audio_end_ms >= 500

    segment = audio[16 * started.padded_start_ms : 16 * stopped.audio_end_ms + 16 * 200]
    transcript = await asr.transcribe(AudioChunk(segment, 16000).to_float32(), final=True)
    assert transcript is not None and transcript.final
    assert heard_the_question(transcript.text), transcript.text


def question_audio(question_16k: np.ndarray) -> np.ndarray:
    """The question as a turn gives it to Whisper: from 300 ms (the prefix padding) before the speech."""
    return AudioChunk(with_silence(question_16k)[16 * (LEAD_MS - 300) :], 16000).to_float32()


def same_model(asr: AsrEngine, window_s: float) -> AsrEngine:
    return AsrEngine(asr._model, language=asr.language, final_beam_size=1, load_seconds=0.0, window_s=window_s)


async def test_short_window_matches_the_full_window(asr: AsrEngine, question_16k: np.ndarray) -> None:
    audio = question_audio(question_16k)
    full = same_model(asr, window_s=30.0)
    try:
        calls, retries = asr.windowed_calls, asr.full_window_retries
        short = await asr.transcribe(audio, final=True)
        reference = await full.transcribe(audio, final=True)
    finally:
        full.close()
    # The short window's own output was used (no retry over 30 s), and it says what 30 s says.
    assert (asr.windowed_calls, asr.full_window_retries) == (calls + 1, retries)
    assert short is not None and reference is not None
    assert short.text == reference.text and heard_the_question(short.text), (short, reference)


async def test_a_3s_window_still_gives_the_right_words(asr: AsrEngine, question_16k: np.ndarray) -> None:
    audio = question_audio(question_16k)[: 16000 * 3]
    tiny_window = same_model(asr, window_s=3.0)
    try:
        transcript = await tiny_window.transcribe(audio, final=True)
    finally:
        tiny_window.close()
    assert tiny_window.windowed_calls == 1
    assert transcript is not None and heard_the_question(transcript.text), transcript


async def test_degenerate_window_output_is_decoded_again_over_30s(
    asr: AsrEngine, question_16k: np.ndarray, monkeypatch: pytest.MonkeyPatch
) -> None:
    """When the windowed decode looks degenerate (here: declared so), the 30 s decode gives the text."""
    monkeypatch.setattr(inference.asr, "looks_degenerate", lambda text, tokens, budget: True)
    engine = same_model(asr, window_s=15.0)
    try:
        transcript = await engine.transcribe(question_audio(question_16k), final=True)
    finally:
        engine.close()
    assert (engine.windowed_calls, engine.full_window_retries) == (1, 1)
    assert transcript is not None and heard_the_question(transcript.text), transcript


async def test_a_partial_is_decoded_on_its_shorter_window_and_dropped_when_degenerate(
    asr: AsrEngine, question_16k: np.ndarray, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Partials take the 10 s window, finals the 15 s one; a degenerate partial is dropped, not decoded over 30 s."""
    engine = AsrEngine(asr._model, language=asr.language, final_beam_size=1, load_seconds=0.0, window_s=15.0,
                       partial_window_s=10.0, partial_budget=64)
    windows: list[float] = []
    decode = engine._decode_window
    monkeypatch.setattr(engine, "_decode_window", lambda audio, window_s, *rest: windows.append(window_s) or decode(audio, window_s, *rest))
    audio = question_audio(question_16k)
    try:
        assert not engine.partials_serve_as_finals
        partial = await engine.transcribe(audio, final=False)
        final = await engine.transcribe(audio, final=True)
        assert windows == [10.0, 15.0]
        assert partial is not None and heard_the_question(partial.text), partial
        assert final is not None and heard_the_question(final.text), final
        monkeypatch.setattr(inference.asr, "looks_degenerate", lambda text, tokens, budget: True)
        assert await engine.transcribe(audio, final=False) is None
        assert (engine.partials_degenerate, engine.full_window_retries) == (1, 0)
        retried = await engine.transcribe(audio, final=True)  # a final is decoded again over 30 s
        assert engine.full_window_retries == 1 and retried is not None and heard_the_question(retried.text)
    finally:
        engine.close()


async def test_partials_on_a_growing_buffer(asr: AsrEngine, question_16k: np.ndarray) -> None:
    audio = question_audio(question_16k)
    stabilizer = TranscriptStabilizer()
    partials = []
    for end_ms in (700, 1300, 2000):
        result = await asr.transcribe(audio[: 16 * end_ms], final=False)
        assert result is not None and not result.final
        partials.append(result.text)
        stabilizer.update(result.text)
        assert result.seconds < 2.0
    # The first 2 s of the question, heard as its words; the stable words are some of them.
    assert words(partials[-1]) and heard_within(partials[-1], QUESTION) >= HEARD_AS_SAID, partials
    assert len(partials[0]) < len(partials[-1])
    assert words(stabilizer.stable) and heard_within(stabilizer.stable, QUESTION) >= HEARD_AS_SAID, partials


async def test_a_final_is_not_delayed_behind_queued_partials(asr: AsrEngine, question_16k: np.ndarray) -> None:
    audio = AudioChunk(question_16k, 16000).to_float32()
    order: list[str] = []

    async def run(name: str, final: bool, stream: str):
        result = await asr.transcribe(audio, final=final, stream=stream)
        order.append(name)
        return result

    running = asyncio.create_task(run("running", False, "a"))
    await asyncio.sleep(0.05)  # the worker has taken it
    queued = [asyncio.create_task(run(f"partial-{s}", False, s)) for s in ("b", "c", "d")]
    await asyncio.sleep(0)
    final = asyncio.create_task(run("final", True, "a"))
    first = await running
    result = await final
    await asyncio.gather(*queued)
    assert order[:2] == ["running", "final"], order
    assert first is not None and result is not None
    # It waited for the call in progress only, not for the three partials queued before it (each as long as
    # that call: behind them it would have waited about four times as long).
    assert result.waited_seconds < 2 * first.seconds, (result.waited_seconds, first.seconds)
    assert heard_the_question(result.text), result.text


async def test_tts_streams_and_cancels_between_chunks(tts: TtsEngine) -> None:
    text = " ".join(
        [
            "The first sentence is short.",
            "The second sentence is a good deal longer, so that it takes the voice some time to say.",
            "A third sentence follows, and it is long as well, to give the worker plenty to do.",
            "The fourth sentence should never be spoken at all, because we stop before it.",
            "Nor should the fifth sentence, which is here only to make the whole text slow.",
        ]
    )
    started = time.perf_counter()
    whole = tts.synthesize_blocking(text)
    whole_seconds = time.perf_counter() - started
    assert whole.dtype == np.int16 and whole.size > tts.sample_rate * 10

    got: list[np.ndarray] = []
    first_chunk = asyncio.get_running_loop().create_future()

    async def speak() -> None:
        async for pcm in tts.synthesize(text):
            got.append(pcm)
            if not first_chunk.done():
                first_chunk.set_result(time.perf_counter())
            await asyncio.sleep(10)  # a slow consumer: the next chunk is not requested yet

    t0 = time.perf_counter()
    task = asyncio.create_task(speak())
    first_at = await first_chunk
    assert first_at - t0 < whole_seconds / 2, whole_seconds  # the first clause, not the whole text
    assert got[0].dtype == np.int16 and got[0].size > tts.sample_rate // 2
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task

    # The worker is free at once: a new reply's first chunk does not wait for the rest of the text.
    t1 = time.perf_counter()
    async for pcm in tts.synthesize("Hello there."):
        assert pcm.size > 0
        break
    assert time.perf_counter() - t1 < max(0.5, whole_seconds / 2), whole_seconds
    assert len(got) == 1


async def test_first_clause_voice_holds_every_core_and_says_the_same(
    asr: AsrEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first clause runs on its own 2-thread session, declared exclusive (the LLM engine waits)."""
    import inference.tts

    two = TtsEngine.load(embedded_tts(), threads=1, first_clause_threads=2, variation=False)
    declared: list[tuple[int, bool]] = []
    real = inference.tts.using_cores

    def spy(cores: int = 1, *, exclusive: bool = False, work: str | None = None):  # type: ignore[no-untyped-def]
        declared.append((cores, exclusive))
        return real(cores, exclusive=exclusive, work=work)

    monkeypatch.setattr(inference.tts, "using_cores", spy)
    try:
        text = "The capital of France is Paris."
        first = np.concatenate([pcm async for pcm in two.synthesize(text, first_clause=True)])
        assert declared and set(declared) == {(2, True)}
        declared.clear()
        rest = np.concatenate([pcm async for pcm in two.synthesize(text)])
        assert declared and set(declared) == {(1, False)}
        # Other live speech queued behind it: the first clause goes on one thread, and the LLM does not wait.
        declared.clear()
        release = threading.Event()
        blocker = two._worker.submit("live", release.wait)
        first_clause = asyncio.create_task(collect(two.synthesize(text, first_clause=True)))
        await asyncio.sleep(0.05)
        other = asyncio.create_task(collect(two.synthesize(text)))
        await asyncio.sleep(0.05)
        release.set()
        await asyncio.wrap_future(blocker)
        assert (await first_clause).size == first.size and (await other).size == rest.size
        assert declared and set(declared) == {(1, False)}
    finally:
        two.close()
    # The same take from both sessions (up to float rounding), the first without Piper's lead-in.
    lead_in = rest.size - first.size
    assert 0 < lead_in <= two.sample_rate * 80 // 1000
    assert np.abs(first.astype(np.int32) - rest[lead_in:].astype(np.int32)).max() <= 64
    frame = two.sample_rate // 200  # 5 ms
    levels = [np.sqrt(np.mean(first[i : i + frame].astype(np.float64) ** 2)) for i in range(0, 8 * frame, frame)]
    assert next(i for i, level in enumerate(levels) if level > 100) <= 3  # sound within 15 ms
    heard = await asr.transcribe(AudioChunk(resample(first, two.sample_rate, 16000), 16000).to_float32(), final=True)
    assert heard is not None and heard_as(heard.text, text) >= HEARD_AS_SAID, heard


async def test_piper_speaks_as_its_own_synthesize_and_two_workers_speak_side_by_side() -> None:
    """The sentences go through Piper's phonemes and model one hop each, with Piper's own normalization; two
    worker threads synthesize two texts at the same time and each says what one worker says."""
    from piper import SynthesisConfig

    texts = ("The capital of France is Paris. It is a big city.", "Two plus two is four, and four plus four is eight.")
    two = TtsEngine.load(embedded_tts(), threads=1, variation=False, workers=2)
    try:
        config = SynthesisConfig(normalize_audio=True, volume=0.9, noise_scale=0.0, noise_w_scale=0.0)
        own = np.concatenate([chunk.audio_int16_array for chunk in two._voice.piper.synthesize(texts[0], syn_config=config)])
        alone = [two.synthesize_blocking(text) for text in texts]
        assert np.array_equal(alone[0], own)
        running: list[int] = []
        real = two._chunks

        def watched(*args, **kwargs):  # type: ignore[no-untyped-def]
            for pcm in real(*args, **kwargs):
                running.append(two._worker._running)
                yield pcm

        two._chunks = watched  # type: ignore[method-assign]
        together = await asyncio.gather(*(collect(two.synthesize(text)) for text in texts))
        assert max(running) == 2  # both threads were synthesizing at once
        for made, expected in zip(together, alone):
            assert made.shape == expected.shape and np.abs(made.astype(np.int32) - expected).max() <= 2
    finally:
        two.close()
