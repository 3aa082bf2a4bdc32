"""The input audio buffer: samples addressed by stream index, trimmed from the front."""

from __future__ import annotations

import numpy as np

from gateway.realtime.input_buffer import InputAudioBuffer


def test_slices_by_stream_index_across_appends() -> None:
    buffer = InputAudioBuffer()
    buffer.append(np.arange(0, 100, dtype=np.int16))
    buffer.append(np.arange(100, 250, dtype=np.int16))
    assert buffer.end == 250
    assert buffer.slice(90, 110).tolist() == list(range(90, 110))
    assert buffer.slice(240, 400).tolist() == list(range(240, 250))


def test_discarding_keeps_indices_stable() -> None:
    buffer = InputAudioBuffer()
    buffer.append(np.arange(0, 1000, dtype=np.int16))
    buffer.discard_before(600)
    assert buffer.start == 600 and buffer.held_ms == 1000 * 400 / 16000
    assert buffer.slice(0, 610).tolist() == list(range(600, 610))
    buffer.append(np.arange(1000, 1010, dtype=np.int16))
    assert buffer.slice(995, 1005).tolist() == list(range(995, 1005))


def test_clear_empties_but_the_clock_goes_on() -> None:
    buffer = InputAudioBuffer()
    buffer.append(np.ones(320, dtype=np.int16))
    buffer.clear()
    assert buffer.held_ms == 0 and buffer.end == 320
    assert buffer.slice(0, 320).size == 0
    assert InputAudioBuffer.ms_to_index(20) == 320 and InputAudioBuffer.index_to_ms(320) == 20
