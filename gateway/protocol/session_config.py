"""The Realtime session object (GA shape) and partial updates to it."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from gateway.protocol.errors import ApiError
from gateway.protocol.validation import Temperature, api_error_from_validation

MAX_OUTPUT_TOKENS = 4096
# Far more than any context window holds (the embedded model's 8192 tokens are ~32 KB of text), and
# little enough to tokenize in milliseconds: 14 MiB of instructions had cost 15 s of tokenizer CPU
# before the context check refused them, slowing every other session's replies 5x.
MAX_INSTRUCTIONS_CHARS = 256 * 1024


def check_max_output_tokens(value: int | str | None) -> int | str | None:
    """A session's or a response's max_output_tokens: 1..MAX_OUTPUT_TOKENS or "inf" (None: unset)."""
    if isinstance(value, int) and not 1 <= value <= MAX_OUTPUT_TOKENS:
        raise ValueError(f"max_output_tokens must be between 1 and {MAX_OUTPUT_TOKENS}, or 'inf'")
    return value

OutputModality = Literal["text", "audio"]
AUDIO_FORMAT_RATES = {"audio/pcm": 24000, "audio/pcmu": 8000, "audio/pcma": 8000}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class AudioFormat(_Strict):
    type: Literal["audio/pcm", "audio/pcmu", "audio/pcma"] = "audio/pcm"
    rate: int | None = None

    @field_validator("rate")
    @classmethod
    def _rate_matches_type(cls, rate: int | None, info: Any) -> int | None:
        expected = AUDIO_FORMAT_RATES[info.data.get("type", "audio/pcm")]
        if rate is not None and rate != expected:
            raise ValueError(f"{info.data.get('type')} is {expected} Hz")
        return expected

    @property
    def sample_rate(self) -> int:
        return AUDIO_FORMAT_RATES[self.type]


class TurnDetection(_Strict):
    type: Literal["server_vad", "semantic_vad"] = "server_vad"
    threshold: float = Field(0.5, ge=0.0, le=1.0)
    prefix_padding_ms: int = Field(300, ge=0, le=5000)
    silence_duration_ms: int = Field(400, ge=0, le=10000)
    create_response: bool = True
    interrupt_response: bool = True
    idle_timeout_ms: int | None = Field(None, ge=5000, le=30000)
    eagerness: Literal["low", "medium", "high", "auto"] | None = None


class Transcription(_Strict):
    model: str | None = None
    language: str | None = None
    prompt: str | None = None


class AudioInput(_Strict):
    format: AudioFormat = Field(default_factory=AudioFormat)
    transcription: Transcription | None = Field(default_factory=Transcription)
    turn_detection: TurnDetection | None = Field(default_factory=TurnDetection)
    noise_reduction: dict[str, Any] | None = None


class AudioOutput(_Strict):
    format: AudioFormat = Field(default_factory=AudioFormat)
    voice: str = "joe"
    speed: float = Field(1.0, ge=0.25, le=1.5)


class AudioConfig(_Strict):
    input: AudioInput = Field(default_factory=AudioInput)
    output: AudioOutput = Field(default_factory=AudioOutput)


class FunctionTool(_Strict):
    type: Literal["function"] = "function"
    name: str = Field(min_length=1, max_length=64)
    description: str | None = None
    parameters: dict[str, Any] | None = None


class SessionConfig(_Strict):
    type: Literal["realtime"] = "realtime"
    object: Literal["realtime.session"] = "realtime.session"
    id: str = ""
    model: str = ""
    output_modalities: list[OutputModality] = Field(default_factory=lambda: list[OutputModality](["audio"]), min_length=1)
    instructions: str = Field("", max_length=MAX_INSTRUCTIONS_CHARS)
    audio: AudioConfig = Field(default_factory=AudioConfig)
    tools: list[FunctionTool] = Field(default_factory=list)
    tool_choice: str | dict[str, Any] = "auto"
    max_output_tokens: int | Literal["inf"] = "inf"
    temperature: Temperature = 0.7
    tracing: Any = None
    truncation: Any = "auto"
    prompt: Any = None
    include: list[str] | None = None
    expires_at: int = 0

    @field_validator("output_modalities")
    @classmethod
    def _one_modality(cls, value: list[str]) -> list[str]:
        # As in OpenAI's GA API: "audio" implies its transcript, so the two are never combined.
        if len(set(value)) != 1:
            raise ValueError('output_modalities is either ["text"] or ["audio"]')
        return value

    @field_validator("max_output_tokens")
    @classmethod
    def _positive(cls, value: int | str) -> int | str:
        return check_max_output_tokens(value)

    def wants_audio(self) -> bool:
        return "audio" in self.output_modalities


READ_ONLY_FIELDS = {"id", "object", "expires_at"}


def _deep_merge(base: dict[str, Any], update: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def apply_session_update(current: SessionConfig, update: Any, *, param: str = "session") -> SessionConfig:
    """Merge a partial session object into the current one; fields absent from it are kept.

    `null` clears a nullable field (`turn_detection: null` switches to manual turns).
    """
    if not isinstance(update, dict):
        raise ApiError("invalid_type", f"'{param}' must be an object", param)
    read_only = READ_ONLY_FIELDS & update.keys()
    if read_only:
        field = sorted(read_only)[0]
        raise ApiError("invalid_value", f"'{param}.{field}' cannot be changed", f"{param}.{field}")
    merged = _deep_merge(current.model_dump(), update)
    try:
        return SessionConfig.model_validate(merged)
    except ValidationError as exc:
        raise api_error_from_validation(exc, prefix=param) from None
