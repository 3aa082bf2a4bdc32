import threading

import numpy as np
import pytest

from media.playout import PlayoutBuffer

RATE = 48000
FRAME = 960  # 20 ms


def tone(samples: int, value: int = 1000) -> np.ndarray:
    return np.full(samples, value, dtype=np.int16)


def test_silence_when_empty() -> None:
    buf = PlayoutBuffer(RATE, FRAME)
    frame = buf.read_frame()
    assert frame.pcm.shape == (FRAME,) and frame.pcm.dtype == np.int16 and not frame.pcm.any()
    assert frame.item_id is None and not frame.started and not frame.stopped and frame.audio_samples == 0


def test_frames_are_exact_and_padded_and_flags_mark_the_edges() -> None:
    buf = PlayoutBuffer(RATE, FRAME)
    buf.write("item_a", tone(2 * FRAME + 100))
    frames = [buf.read_frame() for _ in range(4)]
    assert all(f.pcm.shape == (FRAME,) for f in frames)
    assert [f.started for f in frames] == [True, False, False, False]
    assert [f.stopped for f in frames] == [False, False, True, False]
    assert [f.audio_samples for f in frames] == [FRAME, FRAME, 100, 0]
    assert [f.item_id for f in frames] == ["item_a", "item_a", "item_a", None]
    assert frames[2].pcm[:100].tolist() == [1000] * 100 and not frames[2].pcm[100:].any()


def test_a_frame_spans_writes_and_items_in_order() -> None:
    buf = PlayoutBuffer(RATE, FRAME)
    buf.write("a", tone(500, 1))
    buf.write("b", tone(500, 2))
    frame = buf.read_frame()
    assert frame.item_id == "a"
    assert frame.pcm[:500].tolist() == [1] * 500 and frame.pcm[500:].tolist() == [2] * 460
    assert buf.played_ms("a") == pytest.approx(500 / 48)
    assert buf.played_ms("b") == pytest.approx(460 / 48)
    assert buf.queued_ms == pytest.approx(40 / 48)


def test_played_ms_counts_only_audio_handed_out() -> None:
    buf = PlayoutBuffer(RATE, FRAME)
    buf.write("a", tone(RATE))  # 1 s written
    for _ in range(10):
        buf.read_frame()
    assert buf.played_ms("a") == pytest.approx(200.0)
    assert buf.queued_ms == pytest.approx(800.0)
    assert buf.played_ms("never") == 0.0


def test_clear_mid_item_stops_within_one_frame() -> None:
    buf = PlayoutBuffer(RATE, FRAME)
    buf.write("a", tone(RATE))
    buf.read_frame()
    buf.read_frame()
    assert buf.clear() == 960
    after = buf.read_frame()
    assert not after.pcm.any() and not after.stopped and not after.started
    assert buf.played_ms("a") == pytest.approx(40.0)
    assert buf.queued_ms == 0
    # The next reply starts afresh.
    buf.write("b", tone(FRAME))
    frame = buf.read_frame()
    assert frame.started and frame.stopped and frame.item_id == "b"


def test_producing_turns_an_underrun_into_no_stop() -> None:
    buf = PlayoutBuffer(RATE, FRAME)
    buf.set_producing(True)
    buf.write("a", tone(FRAME))
    assert buf.read_frame().started
    gap = buf.read_frame()  # the TTS is late: silence, but the reply has not stopped
    assert not gap.stopped and not gap.pcm.any()
    buf.write("a", tone(FRAME))
    assert not buf.read_frame().started
    buf.set_producing(False)
    assert buf.read_frame().stopped


def test_concurrent_writer_and_reader_lose_nothing() -> None:
    buf = PlayoutBuffer(RATE, FRAME)
    total = 200 * 317
    received: list[np.ndarray] = []

    def writer() -> None:
        for i in range(200):
            buf.write("a", np.arange(i * 317, (i + 1) * 317, dtype=np.int64).astype(np.int16))

    def reader() -> None:
        got = 0
        while got < total:
            frame = buf.read_frame()
            received.append(frame.pcm[: frame.audio_samples])
            got += frame.audio_samples

    threads = [threading.Thread(target=writer), threading.Thread(target=reader)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=10)
    out = np.concatenate(received)
    assert np.array_equal(out, np.arange(total, dtype=np.int64).astype(np.int16))
    assert buf.played_ms("a") == pytest.approx(1000 * total / RATE)
