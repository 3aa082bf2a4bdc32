"""The phone calls' VAD: Silero 6.2.3 hears speech that came through G.711, which faster-whisper's v6 file
misses (an interruption over a SIP or Twilio reply went unheard with it); both files read through SileroVad."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.vad_narrowband import listen, phone_band
from benchmarks.voices import EspeakSpeaker, espeak_available
from inference.models import embedded_turn_model, narrowband_vad_path, silero_vad_path
from inference.tts import TtsEngine
from media.resample import resample
from media.vad import WINDOW_SAMPLES, SileroVad

RATE = 16000
SENTENCES = ("Say hello in Spanish.", "Stop. Tell me about cats instead.", "Hold on, I have a question.")
TAIL = np.zeros(RATE, np.int16)  # a second of silence after each, as the VAD's end needs


@pytest.mark.skipif(not espeak_available(), reason="espeak-ng is not installed")
@pytest.mark.parametrize("voice", [EspeakSpeaker("en-us", 175), EspeakSpeaker("en-gb-scotland", 210),
                                   EspeakSpeaker("en-us+f3", 175)], ids=lambda v: v.name)
def test_the_narrowband_model_hears_every_sentence_of_a_phone_caller(voice: EspeakSpeaker) -> None:
    model = SileroVad(narrowband_vad_path())
    for text in SENTENCES:
        speech = voice.say(text, RATE).pcm
        heard, voiced_s, _ = listen(model, phone_band(np.concatenate([speech, TAIL])), speech.size)
        assert heard, (voice.name, text)
        assert voiced_s > 0.3, (voice.name, text, voiced_s)  # most of the speech, not a window at its loudest


def test_the_piper_interruption_the_wideband_file_missed_on_the_phone(tts: TtsEngine) -> None:
    """The gateway's own voice as the caller (the bench's default questions): the clip whose interruption went
    unheard over a SIP and a Twilio reply is heard by the narrowband file, through G.711, far more of it."""
    pcm = resample(tts.synthesize_blocking("Say hello in Spanish."), tts.sample_rate, RATE)
    line = phone_band(np.concatenate([pcm, TAIL]))
    narrow = listen(SileroVad(narrowband_vad_path()), line, pcm.size)
    wide = listen(SileroVad(silero_vad_path()), line, pcm.size)
    assert narrow[0] and narrow[1] > 1.5 * wide[1], (narrow, wide)


def test_both_silero_files_give_probabilities_and_a_foreign_file_is_refused() -> None:
    noise = np.random.default_rng(0).normal(0, 0.05, WINDOW_SAMPLES).astype(np.float32)
    for path in (silero_vad_path(), narrowband_vad_path()):
        model = SileroVad(path)
        first = model.probability(noise)
        assert 0.0 <= first <= 1.0
        model.reset()
        assert model.probability(noise) == pytest.approx(first)  # reset forgets the state
    with pytest.raises(ValueError, match="not a Silero VAD"):
        SileroVad(embedded_turn_model())  # an ONNX file with other inputs
