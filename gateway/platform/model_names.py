"""Which names the served model answers to: its own, the configured aliases, and OpenAI's model names.

OpenAI's names come from the installed openai SDK's own types (its chat and realtime model literals),
so the list follows the SDK the gateway is tested against rather than a copy that goes stale.
"""

from __future__ import annotations

import functools
import typing

from openai.types.audio.speech_model import SpeechModel
from openai.types.audio_model import AudioModel
from openai.types.live.built_in_voice import BuiltInVoice
from openai.types.live.session_config import SessionConfig as LiveSessionConfig
from openai.types.realtime.audio_transcription import AudioTranscription
from openai.types.realtime.realtime_audio_config_output import RealtimeAudioConfigOutput
from openai.types.realtime.realtime_session_create_request import RealtimeSessionCreateRequest
from openai.types.shared.chat_model import ChatModel


def _literals(annotation: object) -> set[str]:
    """Every string literal inside a type annotation (through Union, Optional, Literal)."""
    if typing.get_origin(annotation) is typing.Literal:
        return {value for value in typing.get_args(annotation) if isinstance(value, str)}
    return {name for arg in typing.get_args(annotation) for name in _literals(arg)}


@functools.cache
def openai_model_names() -> frozenset[str]:
    realtime = RealtimeSessionCreateRequest.model_fields["model"].annotation
    return frozenset(_literals(ChatModel) | _literals(realtime))


@functools.cache
def openai_live_model_names() -> frozenset[str]:
    """GPT-Live's model names (gpt-live-1, ...): a Live session's `model`, served by the gateway's model."""
    return frozenset(_literals(LiveSessionConfig.model_fields["model"].annotation))


@functools.cache
def openai_voice_names() -> frozenset[str]:
    """Realtime's voices and GPT-Live's built-in ones."""
    return frozenset(_literals(RealtimeAudioConfigOutput.model_fields["voice"].annotation) | _literals(BuiltInVoice))


@functools.cache
def openai_transcription_names() -> frozenset[str]:
    """Realtime sessions' and POST /v1/audio/transcriptions' transcription model names."""
    return frozenset(_literals(AudioTranscription.model_fields["model"].annotation) | _literals(AudioModel))


@functools.cache
def openai_speech_names() -> frozenset[str]:
    """POST /v1/audio/speech's model names (tts-1, gpt-4o-mini-tts, ...)."""
    return frozenset(_literals(SpeechModel))


class ModelNames:
    def __init__(self, served: str, aliases: list[str], openai_names: bool) -> None:
        self.served = served
        self.listed = [served, *(alias for alias in dict.fromkeys(aliases) if alias != served)]
        self._accepted = set(self.listed) | (openai_model_names() if openai_names else set())

    def __contains__(self, name: object) -> bool:
        return name in self._accepted
