"""AsrEngine's queueing rules with a stand-in model (the real one is exercised in tests/voice)."""

import asyncio
import threading
from types import SimpleNamespace

import numpy as np
import pytest

from inference.asr import AsrEngine, TranscriptStabilizer


class GatedModel:
    """Each call blocks until released; the text says which audio it was (its length in samples)."""

    def __init__(self) -> None:
        self.gate = threading.Semaphore(0)
        self.started = threading.Event()
        self.calls: list[int] = []
        self.kwargs: list[dict] = []

    def transcribe(self, audio: np.ndarray, **kwargs: object):
        self.calls.append(audio.shape[0])
        self.kwargs.append(kwargs)
        self.started.set()
        self.gate.acquire()

        def segments():
            yield SimpleNamespace(text=f" n{audio.shape[0]}", tokens=[1, 2], avg_logprob=-0.25)

        return segments(), None


def audio(n: int) -> np.ndarray:
    return np.zeros(n, dtype=np.float32)


@pytest.fixture
def model_engine():
    model = GatedModel()
    # The stand-in has only transcribe(): Whisper's full window, not the short-window decode.
    engine = AsrEngine(model, language="en", final_beam_size=1, load_seconds=0.0, window_s=30.0,
                       partial_window_s=30.0)
    yield model, engine
    for _ in range(10):
        model.gate.release()
    engine.close()


async def started(model: GatedModel) -> None:
    await asyncio.to_thread(model.started.wait, 5)
    model.started.clear()


async def test_final_jumps_ahead_of_queued_partials_and_partials_are_superseded(model_engine) -> None:
    model, engine = model_engine
    busy = asyncio.create_task(engine.transcribe(audio(1), final=False))
    await started(model)  # the worker is now busy with partial 1
    p2 = asyncio.create_task(engine.transcribe(audio(2), final=False))
    await asyncio.sleep(0)
    p3 = asyncio.create_task(engine.transcribe(audio(3), final=False))
    await asyncio.sleep(0)
    final = asyncio.create_task(engine.transcribe(audio(4), final=True))
    await asyncio.sleep(0.01)
    assert await p2 is None  # replaced by p3 before it ever ran
    for _ in range(3):
        model.gate.release()
    results = await asyncio.gather(busy, final, p3)
    assert [r.text for r in results] == ["n1", "n4", "n3"]
    assert model.calls == [1, 4, 3]  # the final ran before the newer partial; p2 never ran
    assert results[1].final and not results[2].final
    assert results[1].audio_ms == pytest.approx(4 / 16)


async def test_with_two_workers_a_final_runs_beside_a_partial_and_a_partial_never_takes_the_second() -> None:
    model = GatedModel()
    engine = AsrEngine(model, language="en", final_beam_size=1, load_seconds=0.0, window_s=30.0, workers=2,
                       partial_window_s=30.0)
    try:
        busy = asyncio.create_task(engine.transcribe(audio(1), final=False, stream="a"))
        await started(model)  # the first worker holds partial 1
        final = asyncio.create_task(engine.transcribe(audio(2), final=True, stream="b"))
        await started(model)  # ... and the second took the final at once
        other = asyncio.create_task(engine.transcribe(audio(3), final=False, stream="c"))
        await asyncio.sleep(0.05)
        assert model.calls == [1, 2]  # the second worker, though its final is blocked too, is not for partials
        model.gate.release()
        await asyncio.sleep(0.05)
        assert sum(task.done() for task in (busy, final)) == 1 and not other.done()
        for _ in range(2):
            model.gate.release()
        assert [r.text for r in await asyncio.gather(busy, final, other)] == ["n1", "n2", "n3"]
        assert sorted(model.calls) == [1, 2, 3] and model.calls[2] == 3
    finally:
        for _ in range(5):
            model.gate.release()
        engine.close()
    with pytest.raises(ValueError, match="workers"):
        AsrEngine(model, language="en", final_beam_size=1, load_seconds=0.0, workers=0)


async def test_partials_of_different_streams_do_not_replace_each_other(model_engine) -> None:
    model, engine = model_engine
    busy = asyncio.create_task(engine.transcribe(audio(1), final=False, stream="x"))
    await started(model)
    a = asyncio.create_task(engine.transcribe(audio(2), final=False, stream="a"))
    b = asyncio.create_task(engine.transcribe(audio(3), final=False, stream="b"))
    await asyncio.sleep(0.01)
    for _ in range(3):
        model.gate.release()
    assert [r.text for r in await asyncio.gather(busy, a, b)] == ["n1", "n2", "n3"]


async def test_a_cancelled_queued_job_never_runs(model_engine) -> None:
    model, engine = model_engine
    busy = asyncio.create_task(engine.transcribe(audio(1), final=True))
    await started(model)
    doomed = asyncio.create_task(engine.transcribe(audio(2), final=True))
    await asyncio.sleep(0.01)
    doomed.cancel()
    with pytest.raises(asyncio.CancelledError):
        await doomed
    kept = asyncio.create_task(engine.transcribe(audio(3), final=True))
    for _ in range(2):
        model.gate.release()
    assert [(await busy).text, (await kept).text] == ["n1", "n3"]
    assert model.calls == [1, 3]


async def test_decoding_options(model_engine) -> None:
    model, engine = model_engine
    model.gate.release()
    await engine.transcribe(audio(5), final=False, prompt="Paris")
    kw = model.kwargs[0]
    assert kw["temperature"] == 0.0 and kw["beam_size"] == 1 and kw["language"] == "en"
    assert kw["vad_filter"] is False and kw["condition_on_previous_text"] is False and kw["without_timestamps"] is True
    assert kw["initial_prompt"] == "Paris"


async def test_model_errors_reach_the_caller() -> None:
    class Broken:
        def transcribe(self, audio, **kwargs):
            raise RuntimeError("boom")

    engine = AsrEngine(Broken(), language="en", final_beam_size=1, load_seconds=0.0, window_s=30.0,
                       partial_window_s=30.0)
    try:
        with pytest.raises(RuntimeError, match="boom"):
            await engine.transcribe(audio(1), final=True)
    finally:
        engine.close()


async def test_a_transcripts_confidence_is_whispers_over_all_its_tokens() -> None:
    """The full window's segments each carry their average log-probability: the transcript's weighs them by
    their tokens, the end token included; with no segment (Whisper took the audio for silence) it is unknown."""

    class Segments:
        def __init__(self, *segments: SimpleNamespace) -> None:
            self.segments = segments

        def transcribe(self, audio, **kwargs):
            return iter(self.segments), None

    two = Segments(SimpleNamespace(text=" Hello", tokens=[1], avg_logprob=-0.1),
                   SimpleNamespace(text=" there", tokens=[1, 2, 3], avg_logprob=-0.6))
    for model, text, avg_logprob in ((two, "Hello there", (-0.1 * 2 - 0.6 * 4) / 6), (Segments(), "", None)):
        engine = AsrEngine(model, language="en", final_beam_size=1, load_seconds=0.0, window_s=30.0,
                       partial_window_s=30.0)
        try:
            transcript = await engine.transcribe(audio(1), final=True)
        finally:
            engine.close()
        assert transcript is not None and transcript.text == text
        assert transcript.avg_logprob == (pytest.approx(avg_logprob) if avg_logprob is not None else None)


def test_stabilizer_returns_the_words_two_partials_agree_on() -> None:
    s = TranscriptStabilizer()
    assert s.update("What is") == ""
    assert s.update("What is the cap") == "What is"
    assert s.update("What is the capital of") == "What is the"
    assert s.update("What is the capital of France?") == "What is the capital of"
    # Case and punctuation do not count as disagreement; the latest wording is returned.
    assert s.update("what is the capital of France") == "what is the capital of France"
    # A revision shrinks the prefix.
    assert s.update("What was the capital") == "What"
    s.reset()
    assert s.stable == "" and s.update("Hello") == ""


async def test_a_partial_due_while_a_listener_waits_elsewhere_is_dropped_and_finals_never_are(model_engine) -> None:
    model, engine = model_engine
    waiting = True
    engine.partials_yield_to = lambda: waiting
    busy = asyncio.create_task(engine.transcribe(audio(1), final=True))
    await started(model)  # the worker is busy: what follows queues
    partial = asyncio.create_task(engine.transcribe(audio(2), final=False))
    final = asyncio.create_task(engine.transcribe(audio(3), final=True))
    await asyncio.sleep(0.05)
    model.gate.release()  # busy ends; the final runs first, then the partial would: it is dropped
    await busy
    await started(model)
    model.gate.release()
    assert (await final).text == "n3"
    assert await partial is None
    assert engine.stats()["partials_skipped"] == 1 and model.calls == [1, 3]
    waiting = False  # nothing waits elsewhere: partials run again
    later = asyncio.create_task(engine.transcribe(audio(4), final=False))
    await started(model)
    model.gate.release()
    assert (await later).text == "n4" and engine.stats()["partials_skipped"] == 1


async def test_partials_past_their_share_of_a_core_are_dropped_and_finals_still_run() -> None:
    model = GatedModel()
    # 0.01 of a core: the burst's 0.5 core-seconds, then a partial every 100 s.
    engine = AsrEngine(model, language="en", final_beam_size=1, load_seconds=0.0, window_s=30.0, partial_budget=0.01,
                       partial_window_s=30.0)
    try:
        first = asyncio.create_task(engine.transcribe(audio(1), final=False))
        await started(model)
        await asyncio.sleep(0.6)  # this partial holds the worker longer than the burst allows
        model.gate.release()
        assert (await first).text == "n1"
        assert await engine.transcribe(audio(2), final=False) is None  # over the budget
        assert engine.stats()["partials_skipped"] == 1
        final = asyncio.create_task(engine.transcribe(audio(3), final=True))
        await started(model)
        model.gate.release()
        assert (await final).text == "n3" and model.calls == [1, 3]
    finally:
        for _ in range(5):
            model.gate.release()
        engine.close()
    with pytest.raises(ValueError):
        AsrEngine(model, language="en", final_beam_size=1, load_seconds=0.0, partial_budget=0.0)
