"""The speech endpoints' pure parts: the TTS worker's priorities, the voice table, subtitles."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from gateway.api.audio_requests import srt, vtt
from gateway.platform.voices import OPENAI_VOICES, VoiceCatalog, piper_voice_name
from gateway.protocol.errors import ApiError
from inference.asr import TranscriptSegment
from inference.tts import Priority, PriorityWorker


def order_run(busy: Priority, hops: list[tuple[str, Priority, float | None]]) -> list[str]:
    """The order in which a one-thread worker runs `hops` (name, priority, deadline), all queued while a hop of
    priority `busy` holds it."""
    worker = PriorityWorker("test-tts")
    release, started = threading.Event(), threading.Event()
    order: list[str] = []
    try:
        running = worker.submit(busy, lambda: started.set() or release.wait())
        assert started.wait(5)
        futures = [worker.submit(priority, lambda name=name: order.append(name), deadline)
                   for name, priority, deadline in hops]
        release.set()
        running.result(5)
        for future in futures:
            future.result(5)
    finally:
        worker.shutdown()
    return order


def test_live_hops_run_before_queued_background_hops() -> None:
    hops: list[tuple[str, Priority, float | None]] = [
        ("bg1", "background", None), ("live1", "live", None), ("bg2", "background", None), ("live2", "live", None)]
    assert order_run("background", hops) == ["live1", "live2", "bg1", "bg2"]


def test_live_hops_run_earliest_deadline_first() -> None:
    """A reply's later clause is due when the audio already sent has played; a first clause (no deadline) is due
    now, so it goes before later clauses of other replies, but not before a later clause already overdue."""
    now = time.monotonic()
    hops: list[tuple[str, Priority, float | None]] = [
        ("later, due in 3 s", "live", now + 3), ("later, due in 1 s", "live", now + 1), ("first clause", "live", None),
        ("overdue", "live", now - 1), ("another first clause", "live", None), ("speech endpoint", "background", now - 10)]
    assert order_run("live", hops) == ["overdue", "first clause", "another first clause", "later, due in 1 s",
                                       "later, due in 3 s", "speech endpoint"]


def test_a_worker_of_two_threads_runs_two_hops_at_once_and_the_rest_by_deadline() -> None:
    worker = PriorityWorker("test-tts", threads=2)
    release = threading.Event()
    both = threading.Barrier(3, timeout=5)
    order: list[str] = []
    now = time.monotonic()
    try:
        busy = [worker.submit("live", lambda: both.wait() is not None and release.wait()) for _ in range(2)]
        both.wait()  # two hops running together
        assert worker.others_busy() == 1  # as a running hop sees it: the other one
        futures = [worker.submit("live", lambda name=name: order.append(name), now + offset)
                   for name, offset in (("later", 2.0), ("sooner", 1.0))]
        release.set()
        for future in (*busy, *futures):
            future.result(5)
    finally:
        worker.shutdown()
    assert sorted(order) == ["later", "sooner"]
    with pytest.raises(ValueError):
        PriorityWorker("test-tts", threads=0)


def test_a_worker_is_overdue_while_a_live_hop_past_its_deadline_waits() -> None:
    worker = PriorityWorker("test-tts")
    release, started = threading.Event(), threading.Event()
    try:
        busy = worker.submit("live", lambda: started.set() or release.wait())
        assert started.wait(5)
        assert not worker.overdue()  # running is not waiting
        later = worker.submit("live", lambda: None, time.monotonic() + 60)
        background = worker.submit("background", lambda: None)
        assert not worker.overdue()  # due in a minute, and a background hop is never overdue
        first_clause = worker.submit("live", lambda: None)
        assert worker.overdue()
        release.set()
        for future in (busy, first_clause, later, background):
            future.result(5)
        assert not worker.overdue()
    finally:
        worker.shutdown()


def test_shutdown_cancels_queued_hops() -> None:
    worker = PriorityWorker("test-tts")
    release, started = threading.Event(), threading.Event()
    running = worker.submit("live", lambda: started.set() or release.wait())
    assert started.wait(5)
    queued = worker.submit("background", lambda: None)
    worker.shutdown()
    release.set()
    assert running.result(5) is True and queued.cancelled()
    with pytest.raises(RuntimeError):
        worker.submit("live", lambda: None)


def test_voice_table() -> None:
    assert piper_voice_name(Path("/x/en_US-joe-medium.onnx")) == "joe"
    assert piper_voice_name(Path("voice.onnx")) == "voice"
    one = VoiceCatalog.from_paths(None, [])
    assert one.installed == ("joe",) and set(one.table().values()) == {"joe"}
    assert one.resolve("marin") == one.resolve("joe") == "joe"
    two = VoiceCatalog.from_paths(None, [Path("/v/en_GB-alba-medium.onnx")])
    table = two.table()
    assert [table[name] for name in OPENAI_VOICES[:4]] == ["joe", "alba", "joe", "alba"]
    assert two.aliases_of("alba") == {name for name, voice in table.items() if voice == "alba"}
    with pytest.raises(ApiError) as caught:
        two.resolve("bob")
    assert caught.value.param == "voice" and "'joe', 'alba'" in caught.value.message
    with pytest.raises(ValueError):
        VoiceCatalog.from_paths(None, [Path("/v/en_US-joe-low.onnx")])  # two voices named joe


def test_subtitles() -> None:
    segments = [TranscriptSegment(0, 0, 0.0, 2.5, " Hello there.", [], 0.0, -0.2, 1.0, 0.01, []),
                TranscriptSegment(1, 0, 3661.0, 3662.25, " Bye.", [], 0.0, -0.2, 1.0, 0.01, [])]
    assert srt(segments) == "1\n00:00:00,000 --> 00:00:02,500\nHello there.\n\n2\n01:01:01,000 --> 01:01:02,250\nBye.\n"
    assert vtt(segments) == "WEBVTT\n\n00:00:00.000 --> 00:00:02.500\nHello there.\n\n01:01:01.000 --> 01:01:02.250\nBye.\n"
