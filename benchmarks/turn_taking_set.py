"""The turn-taking test set: utterances spoken by several voices and mixed in numpy (16 kHz int16). The voices
(`VOICES`): the embedded Piper voice, which is also the gateway's own output voice and so one voice among them,
never the only one; espeak-ng's voices and variants at several speeds; and human recordings that packages carry
(`recordings()`: alsa-utils' channel-test voice, the reading that useful-moonshine-onnx ships), which are
complete utterances only.

- complete: a whole question or request, then silence;
- paused: a sentence with a mid-thought pause of 500-900 ms where its comma is (a comma keeps the voice up, as
  a speaker who has not finished, in Piper and in espeak-ng), then the rest and silence;
- backchannels: what a listener says over a reply without taking the turn ("mm-hm", "yeah"), and coughs;
- interruptions: words addressed to the assistant over its reply;
- noisy: complete utterances mixed with babble, pink or white noise at 5 dB SNR.
"""

from __future__ import annotations

import importlib.util
import wave
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol

import numpy as np

from benchmarks.voice_audio import Clip, Speaker, speech_span
from benchmarks.voices import EspeakSpeaker

RATE = 16000
TRAIL_S = 3.0  # silence after each utterance: longer than any wait for the end of a turn

Kind = Literal["complete", "paused", "backchannel", "interruption", "noisy"]

COMPLETE = [
    "What is the capital of France?",
    "Can you remind me to call my sister at six o'clock?",
    "Please turn off the lights in the kitchen.",
    "How far is it from London to Edinburgh by train?",
    "Tell me a short story about a dragon.",
    "My order has not arrived yet.",
    "Which planet has the most moons?",
    "I would like a table for two at eight tonight.",
    "What time does the pharmacy close on Sundays?",
    "Thanks, that was really helpful.",
    "Yes, please go ahead.",
    "No, I don't think so.",
]
PAUSED = [
    "I'd like to book a flight to, Paris next Tuesday.",
    "The thing I really want to know is, how long the battery lasts.",
    "Can you find me a recipe that uses, chicken and rice?",
    "My phone number is, five five five, one two three four.",
    "I was thinking that maybe we could, go to the beach tomorrow.",
    "What I need is a hotel near, the central station.",
    "Could you tell me, what the weather will be like on Saturday?",
    "I need to buy, some milk and eggs for breakfast.",
    "The meeting should be moved to, Thursday afternoon.",
    "Send a message to, my brother saying I'll be late.",
    "I'm looking for a gift for, my mother's birthday.",
    "Play some music by, the Beatles please.",
    "Can you set an alarm for, half past seven?",
    "I think the best option would be, the train.",
    "How much does it cost to, rent a car for a week?",
    "We are planning a trip to, Japan in the spring.",
    "Remind me to pick up, the dry cleaning after work.",
    "Is there a good restaurant around, the old harbour?",
    "I can't remember if I, locked the front door.",
    "The password for the wifi is, blue sky forty two.",
    "I would like to book a flight to, Paris on Friday.",
    "Can you remind me to call my, mother tomorrow morning.",
]
BACKCHANNELS = ["Mm-hm.", "Yeah.", "Right.", "Uh-huh.", "Okay.", "I see.", "Got it.", "Sure."]
COUGHS = 2
INTERRUPTIONS = [
    "Stop. Wait a second.",
    "No, tell me about cats instead.",
    "Hold on, I have a question.",
    "Wait, stop, what about Berlin instead?",
    "No, no, I meant next Friday.",
    "Hold on, can you say that again?",
    "Sorry, I asked about the weather, not the news.",
    "Actually, make it for three people.",
    "Stop, that's the wrong address.",
    "Hang on, how much does that cost?",
    "Excuse me, can you speak more slowly?",
]
NOISES = ("babble", "pink", "white")
NOISY_SNR_DB = 5.0
PAUSES_MS = (500, 600, 700, 800, 900)


class Voice(Protocol):
    """Says a text at a sample rate (benchmarks.voice_audio.Speaker, benchmarks.voices.EspeakSpeaker)."""

    @property
    def name(self) -> str: ...

    def say(self, text: str, rate: int) -> Clip: ...


# espeak-ng's voices and variants, each at its own speed (words a minute; its default is 175).
ESPEAK_VOICES = (EspeakSpeaker("en-us", 175), EspeakSpeaker("en-gb", 150), EspeakSpeaker("en-gb-scotland", 200),
                 EspeakSpeaker("en-us+f3", 160), EspeakSpeaker("en-us+m7", 210))
PIPER = Speaker.name  # the gateway's own output voice
ALSA_SOUNDS = Path("/usr/share/sounds/alsa")  # Debian alsa-utils: a person naming each loudspeaker
ALSA_CLIPS = {"Front_Center": "Front center.", "Front_Left": "Front left.", "Front_Right": "Front right.",
              "Rear_Center": "Rear center.", "Rear_Left": "Rear left.", "Rear_Right": "Rear right.",
              "Side_Left": "Side left.", "Side_Right": "Side right."}
# useful-moonshine-onnx's reading (16 kHz, 9.96 s): three parts, cut in its two longest silences (2.69-3.08 s and
# 5.50-6.67 s), each a complete utterance (what Whisper base and tiny.en hear, and the words of Beckett's line).
BECKETT_PARTS = ((0.0, 2.80, "Ever tried, ever failed."), (2.95, 5.60, "No matter, try again."),
                 (6.55, 9.96, "Fail again, fail better."))


@dataclass(frozen=True)
class Utterance:
    kind: Kind
    voice: str
    text: str  # what is said ("" for a cough)
    pcm: np.ndarray  # int16 at RATE: the utterance, then TRAIL_S of silence (or of the noise)
    speech_end: int  # the sample after its last speech
    pause: tuple[int, int] | None = None  # paused: where its mid-thought pause starts and ends
    noise: str | None = None
    clean: np.ndarray | None = None  # noisy: the same speech without the noise


def _pause_at_comma(pcm: np.ndarray) -> tuple[int, int]:
    """The longest quiet run inside the speech (Piper's pause at the comma), as (start, end) samples."""
    frame = RATE // 100
    onset, end = speech_span(pcm, RATE)
    frames = pcm[onset:end][: (end - onset) // frame * frame].astype(np.float64).reshape(-1, frame) / 32768.0
    quiet = np.sqrt(np.mean(frames**2, axis=1)) < 10 ** (-45 / 20)
    best, run_start, best_span = 0, None, (0, 0)
    for i, q in enumerate([*quiet, False]):
        if q and run_start is None:
            run_start = i
        elif not q and run_start is not None:
            if i - run_start > best:
                best, best_span = i - run_start, (onset + run_start * frame, onset + i * frame)
            run_start = None
    if best == 0:
        raise ValueError("no pause in the utterance")
    return best_span


def _noise(kind: str, n: int, rng: np.random.Generator, voices: list[np.ndarray]) -> np.ndarray:
    if kind == "white":
        return rng.standard_normal(n)
    if kind == "pink":
        spectrum = np.fft.rfft(rng.standard_normal(n))
        spectrum /= np.sqrt(np.maximum(np.arange(len(spectrum)), 1))
        return np.fft.irfft(spectrum, n)
    babble = np.zeros(n)
    for _ in range(6):  # six talkers, reversed so that no word can be understood
        voice = voices[int(rng.integers(len(voices)))].astype(np.float64)[::-1]
        babble += np.roll(np.resize(voice, n), int(rng.integers(n)))
    return babble


def _cough(rng: np.random.Generator) -> np.ndarray:
    """A cough's shape: two bursts of noise, loud and short, with a falling envelope."""
    parts = []
    for length_ms in (180, 120):
        n = RATE * length_ms // 1000
        burst = rng.standard_normal(n) * np.exp(-np.linspace(0, 5, n)) * 9000
        parts += [burst, np.zeros(RATE * 60 // 1000)]
    return np.clip(np.concatenate(parts), -32768, 32767).astype(np.int16)


def _trail(pcm: np.ndarray) -> tuple[np.ndarray, int]:
    onset, end = speech_span(pcm, RATE)
    head = pcm[:end]
    return np.concatenate([head, np.zeros(int(TRAIL_S * RATE), dtype=np.int16)]), end


def build(speaker: Voice, seed: int = 0) -> list[Utterance]:
    rng = np.random.default_rng(seed)
    voice = speaker.name
    out: list[Utterance] = []
    for text in COMPLETE:
        pcm, end = _trail(speaker.say(text, RATE).pcm)
        out.append(Utterance("complete", voice, text, pcm, end))
    for i, text in enumerate(PAUSED):
        pcm = speaker.say(text, RATE).pcm
        start, stop = _pause_at_comma(pcm)
        pause = np.zeros(RATE * PAUSES_MS[i % len(PAUSES_MS)] // 1000, dtype=np.int16)
        joined = np.concatenate([pcm[:start], pause, pcm[stop:]])
        pcm, end = _trail(joined)
        out.append(Utterance("paused", voice, text.replace(",", ""), pcm, end, pause=(start, start + len(pause))))
    for text in BACKCHANNELS:
        pcm, end = _trail(speaker.say(text, RATE).pcm)
        out.append(Utterance("backchannel", voice, text, pcm, end))
    for _ in range(COUGHS):
        pcm, end = _trail(_cough(rng))
        out.append(Utterance("backchannel", voice, "", pcm, end))
    for text in INTERRUPTIONS:
        pcm, end = _trail(speaker.say(text, RATE).pcm)
        out.append(Utterance("interruption", voice, text, pcm, end))
    return out + _noisy(out, [(text, speaker.say(text, RATE).pcm) for text in COMPLETE[:9]], rng)


def _noisy(utterances: list[Utterance], speech: list[tuple[str, np.ndarray]], rng: np.random.Generator) -> list[Utterance]:
    """The speech mixed with babble (of the set's complete utterances), pink or white noise at NOISY_SNR_DB."""
    voices = [u.pcm for u in utterances if u.kind == "complete"]
    out: list[Utterance] = []
    for i, (text, said) in enumerate(speech):
        clean, end = _trail(said)
        kind = NOISES[i % len(NOISES)]
        noise = _noise(kind, len(clean), rng, voices)
        onset = speech_span(clean, RATE)[0]
        speech_power = np.mean(clean[onset:end].astype(np.float64) ** 2)
        noise *= np.sqrt(speech_power / np.mean(noise**2) / 10 ** (NOISY_SNR_DB / 10))
        noisy = np.clip(clean + noise, -32768, 32767).astype(np.int16)
        out.append(Utterance("noisy", utterances[0].voice, text, noisy, end, noise=kind, clean=clean))
    return out


def _read_wav(path: Path) -> np.ndarray:
    """16-bit mono PCM at RATE."""
    from media.resample import resample

    with wave.open(str(path)) as reader:
        pcm = np.frombuffer(reader.readframes(reader.getnframes()), dtype="<i2")
        if reader.getnchannels() > 1:
            pcm = pcm.reshape(-1, reader.getnchannels())[:, 0]
        return resample(pcm.astype(np.int16), reader.getframerate(), RATE)


def beckett_path() -> Path | None:
    spec = importlib.util.find_spec("moonshine_onnx")  # finds the package, never imports it
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / "assets" / "beckett.wav"
    return path if path.exists() else None


def recordings(seed: int = 0) -> tuple[list[Utterance], list[str]]:
    """Human voices, as complete utterances (and the same over noise): alsa-utils' and useful-moonshine-onnx's,
    each a voice of its own; and a note for each recording that is not installed."""
    rng = np.random.default_rng(seed)
    out: list[Utterance] = []
    missing: list[str] = []
    sources: list[tuple[str, list[tuple[str, np.ndarray]]]] = []
    if all((ALSA_SOUNDS / f"{name}.wav").exists() for name in ALSA_CLIPS):
        sources.append(("human:alsa-utils", [(text, _read_wav(ALSA_SOUNDS / f"{name}.wav"))
                                             for name, text in ALSA_CLIPS.items()]))
    else:
        missing.append("human:alsa-utils (apt-get install alsa-utils)")
    beckett = beckett_path()
    if beckett is not None:
        reading = _read_wav(beckett)
        sources.append(("human:moonshine-beckett", [(text, reading[round(a * RATE):round(b * RATE)])
                                                    for a, b, text in BECKETT_PARTS]))
    else:
        missing.append("human:moonshine-beckett (pip install --no-deps useful-moonshine-onnx==20251121)")
    for voice, clips in sources:
        complete = []
        for text, said in clips:
            pcm, end = _trail(said)
            complete.append(Utterance("complete", voice, text, pcm, end))
        out += complete + _noisy(complete, clips, rng)
    return out, missing
