"""A reply's first words start without Piper's lead-in silence (inference.tts.trim_lead_in)."""

import numpy as np

from inference.tts import LEAD_IN_KEPT_MS, trim_lead_in

RATE = 22050


def tone(ms: int, amplitude: int) -> np.ndarray:
    t = np.arange(RATE * ms // 1000) / RATE
    return (amplitude * np.sin(2 * np.pi * 220 * t)).astype(np.int16)


def test_the_lead_in_goes_but_a_few_ms_before_the_sound_stay() -> None:
    quiet, speech = tone(50, 20), tone(300, 8000)
    trimmed = trim_lead_in(np.concatenate([quiet, speech]), RATE)
    kept = len(trimmed) - len(speech)
    assert 0 < kept <= RATE * (LEAD_IN_KEPT_MS + 5) // 1000  # from within one 5 ms frame of the onset
    assert np.array_equal(trimmed[-len(speech) :], speech)


def test_sound_from_the_start_and_silence_are_kept_whole() -> None:
    speech = tone(200, 8000)
    assert np.array_equal(trim_lead_in(speech, RATE), speech)
    silence = np.zeros(RATE // 10, dtype=np.int16)
    assert np.array_equal(trim_lead_in(silence, RATE), silence)
    assert trim_lead_in(np.zeros(3, dtype=np.int16), RATE).size == 3
