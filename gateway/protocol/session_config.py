"""The Realtime session object (GA shape) and partial updates to it."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_serializer,
    model_validator,
)

from gateway.protocol.chat import MEMORY_TOOL_NAME
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


@dataclass(frozen=True)
class SpeechOptions:
    """What this server's voice models offer, for validating a session: the names each answers to.

    OpenAI's voice and transcription model names are accepted for the installed voice and Whisper,
    as model names are for the LLM, so a client written for OpenAI works unchanged."""

    voice: str  # the installed Piper voice's name, the default
    voice_aliases: frozenset[str]
    transcription_model: str  # the installed Whisper's name, the default
    transcription_aliases: frozenset[str]
    transcription_language: str | None  # what the Whisper model transcribes (None: it detects the language)
    # The languages a multilingual Whisper knows (Whisper's codes: "de", "fr", ...); None: not checked.
    transcription_languages: frozenset[str] | None = None

    def apply_defaults(self, config: SessionConfig) -> SessionConfig:
        """A new session speaks with the installed voice and names the installed Whisper."""
        config.audio.output.voice = self.voice
        if config.audio.input.transcription is not None:
            config.audio.input.transcription.model = self.transcription_model
        return config

    def check(self, config: SessionConfig) -> None:
        output = config.audio.output
        if output.voice != self.voice and output.voice not in self.voice_aliases:
            raise ApiError("invalid_value", f"Unknown voice '{output.voice}'. Realtime sessions speak with "
                           f"'{self.voice}' (so do the OpenAI voice names that select it: GET /v1/audio/voices).",
                           "session.audio.output.voice")
        transcription = config.audio.input.transcription
        if transcription is None:
            return
        model = transcription.model
        if model is not None and model != self.transcription_model and model not in self.transcription_aliases:
            raise ApiError("invalid_value", f"Unknown transcription model '{model}'. This server transcribes with "
                           f"'{self.transcription_model}' (OpenAI's names also select it).",
                           "session.audio.input.transcription.model")
        # An English-only model (tiny.en) refuses any other language by name; a multilingual one (--asr-model base)
        # detects the language it hears, so any language a session names is heard as it is spoken.
        if (transcription.language is not None and self.transcription_language is not None
                and transcription.language != self.transcription_language):
            raise ApiError("invalid_value", f"This server's Whisper model ('{self.transcription_model}') transcribes "
                           f"'{self.transcription_language}' only; language '{transcription.language}' is not "
                           "available (--asr-model base transcribes other languages).",
                           "session.audio.input.transcription.language")
        if (transcription.language is not None and self.transcription_languages is not None
                and transcription.language not in self.transcription_languages):
            raise ApiError("invalid_value", f"Whisper knows no language '{transcription.language}': name it by its "
                           "ISO 639-1 code, as 'de' or 'fr'.", "session.audio.input.transcription.language")


class AudioFormat(_Strict):
    """As in the GA API: `rate` belongs to audio/pcm (24000); G.711 formats are 8000 Hz and carry none."""

    type: Literal["audio/pcm", "audio/pcmu", "audio/pcma"] = "audio/pcm"
    rate: int | None = None

    @field_validator("rate")
    @classmethod
    def _rate_matches_type(cls, rate: int | None, info: ValidationInfo) -> int | None:
        kind = info.data.get("type", "audio/pcm")
        if rate is not None and rate != AUDIO_FORMAT_RATES[kind]:
            raise ValueError(f"{kind} is {AUDIO_FORMAT_RATES[kind]} Hz")
        return rate

    @model_validator(mode="after")
    def _rate_follows_type(self) -> AudioFormat:
        self.rate = AUDIO_FORMAT_RATES[self.type] if self.type == "audio/pcm" else None
        return self

    @model_serializer(mode="wrap")
    def _wire(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        if data.get("rate") is None:
            data.pop("rate", None)
        return data

    @property
    def sample_rate(self) -> int:
        return AUDIO_FORMAT_RATES[self.type]


class TurnDetection(_Strict):
    """server_vad: the turn ends after `silence_duration_ms` of silence."""

    type: Literal["server_vad"] = "server_vad"
    threshold: float = Field(0.5, ge=0.0, le=1.0)
    prefix_padding_ms: int = Field(300, ge=0, le=5000)
    silence_duration_ms: int = Field(400, ge=0, le=10000)
    create_response: bool = True
    interrupt_response: bool = True
    idle_timeout_ms: int | None = Field(None, ge=5000, le=30000)


class SemanticVad(_Strict):
    """semantic_vad: the silence that ends the turn depends on how finished the words sound, judged by
    the LLM (inference/llm/end_of_turn.py); `eagerness` sets the range (see SEMANTIC_WAITS_MS)."""

    type: Literal["semantic_vad"]
    eagerness: Literal["low", "medium", "high", "auto"] = "auto"
    create_response: bool = True
    interrupt_response: bool = True

    @property
    def threshold(self) -> float:
        return 0.5

    @property
    def prefix_padding_ms(self) -> int:
        return 300

    @property
    def idle_timeout_ms(self) -> None:
        return None


# Silence before the turn ends under semantic_vad: (when the words sound finished, when they do not). At `auto` and
# `medium` the LLM's shortest wait is the audio model's (AUDIO_SHORTEST_WAITS_MS): either judge sure of the end ends
# the turn as soon. At 400 ms, the turn-taking set's slowest voices (espeak-ng at 140 words a minute), whose
# finished sentences the audio model hears as unfinished, ended theirs 495-509 ms after the last word (p50) against
# 288-306 ms for the others; at 250 ms, 352-367 ms, the pauses ended early over the voices other than the output
# voice 8.3% -> 9.5% (docs/benchmarks.md, "Turn-taking": `text_shortest_sweep`).
SEMANTIC_WAITS_MS: Mapping[str, tuple[int, int]] = {
    "high": (250, 1000), "medium": (250, 2000), "auto": (250, 2000), "low": (600, 4000)}


def semantic_wait_ms(eagerness: str, end_probability: float,
                     waits: Mapping[str, tuple[int, int]] = SEMANTIC_WAITS_MS) -> int:
    """The longest wait at probability 0.001 and below, the shortest at 0.5 and above, log-linear between:
    the model's probabilities for finished short replies ("Yes", "Hello") are 0.03-0.2, for cut-off ones 0.
    `waits`: another table than SEMANTIC_WAITS_MS (benchmarks/turn_taking.py replays a recorded set on others)."""
    shortest, longest = waits[eagerness]
    low, high = math.log10(0.001), math.log10(0.5)
    x = (math.log10(max(end_probability, 1e-9)) - low) / (high - low)
    return round(longest - (longest - shortest) * min(1.0, max(0.0, x)))


# semantic_vad with the audio end-of-turn model (inference/turn_end.py): the turn is complete when its
# probability reaches the eagerness' threshold, and the silence then is this short; otherwise it is the longest
# of SEMANTIC_WAITS_MS. Measured with `python -m benchmarks.turn_taking` (docs/benchmarks.md, "Turn-taking").
AUDIO_TURN_THRESHOLDS = {"high": 0.3, "medium": 0.5, "auto": 0.5, "low": 0.7}
AUDIO_SHORTEST_WAITS_MS = {"high": 150, "medium": 250, "auto": 250, "low": 400}
# The LLM's probability below which the words are cut off ("I'd like to book a flight to": 0.0000, finished
# ones 0.09 and up): the turn waits the longest silence whatever the audio model heard. On the test set the
# audio model alone ended 58% of the mid-thought pauses (Piper's voice stays up at a comma less than a
# person's does); with this veto, see docs/benchmarks.md, "Turn-taking".
TEXT_CUT_OFF = 0.01
# Cut-off words the audio model heard finished: the LLM is not always right ("Name 3 colors.": 0.004), so such a
# turn waits out a long mid-thought pause (the test set's are 0.5-0.9 s; a thinking pause may pass 1 s), not the
# longest silence.
VETOED_WAITS_MS = {"high": 700, "medium": 1500, "auto": 1500, "low": 3000}
# Words Whisper is unsure of (its average log-probability below LEAST_READABLE_LOGPROB, barge_in.py): often a
# misheard first half that reads as a whole sentence ("Send a message to" heard as "Send that message to me."), so
# the LLM's judgement of them does not count and the audio model's "finished" alone waits out a long mid-thought
# pause. On the turn-taking set's voices other than the output voice this cut the pauses ended early from 14.9% to
# 11.9% with every voice's end-of-turn delay unchanged (docs/benchmarks.md, "Turn-taking").
UNSURE_WAITS_MS = {"high": 600, "medium": 1100, "auto": 1100, "low": 2000}
# Words the LLM reads as finished in audio the audio model hears unfinished: the judges disagree, and the LLM's
# probability counts discounted by the audio model's, times sqrt(audio / threshold). Misheard first halves read as
# whole sentences ("Can you set an alarm for it?") in a voice that stays up: on the turn-taking set's voices
# other than the output voice this cut the pauses ended early from 12.5% to 9.5%, the p50 end-of-turn delay
# unchanged (300 ms) and the slowest voices' 65-78 ms later (docs/benchmarks.md, "Turn-taking"); exponents 0.15-0.35 gave
# 10.7%, 0.75 no fewer than 0.5.
AUDIO_DOUBT_EXPONENT = 0.5


def turn_end_wait_ms(eagerness: str, *, audio: float | None = None, text: float | None = None,
                     words_sure: bool = True, waits: Mapping[str, tuple[int, int]] = SEMANTIC_WAITS_MS) -> int:
    """The silence that ends a semantic_vad turn, from its judges: the audio model's probability that the turn is
    complete and the LLM's from its words (semantic_wait_ms), None for a judge that is not there; `words_sure`:
    whether Whisper was sure of the words the LLM judged. Words that are cut off wait the longest (a mid-thought
    pause's worth when they sound finished); otherwise the shorter of the judges' waits, except that words Whisper
    was unsure of are no judge's: finished-sounding audio then waits UNSURE_WAITS_MS, unfinished the longest; where
    the audio sounds unfinished the LLM's probability counts less (AUDIO_DOUBT_EXPONENT). `waits`: as for
    semantic_wait_ms."""
    _, longest = waits[eagerness]
    sounds_finished = audio is not None and audio >= AUDIO_TURN_THRESHOLDS[eagerness]
    if text is not None and text < TEXT_CUT_OFF:
        return VETOED_WAITS_MS[eagerness] if sounds_finished else longest
    if text is not None and not words_sure:
        return UNSURE_WAITS_MS[eagerness] if sounds_finished else longest
    candidates = [longest]
    if sounds_finished:
        candidates.append(AUDIO_SHORTEST_WAITS_MS[eagerness])
    if text is not None:
        doubt = 1.0 if audio is None or sounds_finished else (audio / AUDIO_TURN_THRESHOLDS[eagerness]) ** AUDIO_DOUBT_EXPONENT
        candidates.append(semantic_wait_ms(eagerness, text * doubt, waits))
    return min(candidates)


def server_vad_wait_ms(silence_duration_ms: int, audio: float) -> int:
    """server_vad with --server-vad-turn-model: a turn the audio model hears unfinished waits semantic_vad's
    longest silence (auto) instead of ending after the session's silence_duration_ms; a finished one is as before."""
    if audio >= AUDIO_TURN_THRESHOLDS["auto"]:
        return silence_duration_ms
    return max(silence_duration_ms, SEMANTIC_WAITS_MS["auto"][1])


TurnDetectionConfig = Annotated[TurnDetection | SemanticVad, Field(discriminator="type")]
TURN_DETECTION_TYPES = frozenset({"server_vad", "semantic_vad"})


class Transcription(_Strict):
    model: str | None = None
    language: str | None = Field(None, max_length=16)
    prompt: str | None = Field(None, max_length=4096)


class NoiseReductionConfig(_Strict):
    type: Literal["near_field", "far_field"]


class AudioInput(_Strict):
    format: AudioFormat = Field(default_factory=AudioFormat)
    # null: no transcription events (the server still transcribes for the model, which reads text)
    transcription: Transcription | None = Field(default_factory=Transcription)
    turn_detection: TurnDetectionConfig | None = Field(default_factory=TurnDetection)
    # null: the microphone's audio as it comes; near_field or far_field: DeepFilterNet first (media/denoise.py)
    noise_reduction: NoiseReductionConfig | None = None


class AudioOutput(_Strict):
    format: AudioFormat = Field(default_factory=AudioFormat)
    voice: str = Field("joe", max_length=64)
    speed: float = Field(1.0, ge=0.25, le=1.5)  # Piper's length scale is divided by it


class AudioConfig(_Strict):
    input: AudioInput = Field(default_factory=AudioInput)
    output: AudioOutput = Field(default_factory=AudioOutput)


class FunctionTool(_Strict):
    type: Literal["function"] = "function"
    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")
    description: str | None = None
    parameters: dict[str, Any] | None = None  # a JSON schema; a forced call's arguments always match it


class ToolChoiceFunction(_Strict):
    type: Literal["function"]
    name: str = Field(min_length=1, max_length=64)


ToolChoice = Literal["auto", "none", "required"] | ToolChoiceFunction


def check_tool_choice(tools: list[FunctionTool], choice: ToolChoice) -> None:
    """Raises ValueError when the choice names a function that is not among the tools (or the built-in memory
    tool, which the response refuses when the key's memory is off)."""
    if (isinstance(choice, ToolChoiceFunction) and choice.name != MEMORY_TOOL_NAME
            and choice.name not in {tool.name for tool in tools}):
        raise ValueError(f"tool_choice names '{choice.name}', which is not among the tools")
    if choice == "required" and not tools:
        raise ValueError("tool_choice 'required' needs tools")


class TracingConfig(_Strict):
    workflow_name: str | None = Field(None, max_length=256)
    group_id: str | None = Field(None, max_length=256)
    metadata: dict[str, Any] | None = None


SessionType = Literal["realtime", "transcription"]
# What a transcription session has (GA: RealtimeTranscriptionSessionCreateRequest): no output, no responses.
TRANSCRIPTION_SESSION_FIELDS = frozenset({"type", "audio", "include"})


class SessionConfig(_Strict):
    type: SessionType = "realtime"
    object: Literal["realtime.session"] = "realtime.session"
    id: str = ""
    model: str = ""
    output_modalities: list[OutputModality] = Field(default_factory=lambda: list[OutputModality](["audio"]), min_length=1)
    instructions: str = Field("", max_length=MAX_INSTRUCTIONS_CHARS)
    audio: AudioConfig = Field(default_factory=AudioConfig)
    tools: list[FunctionTool] = Field(default_factory=list, max_length=128)
    tool_choice: ToolChoice = "auto"
    max_output_tokens: int | Literal["inf"] = "inf"
    # The beta API's sampling temperature, kept as an addition (it applies to the session's replies; None: the
    # server's --realtime-temperature). GA session objects have no such field, so it is not echoed.
    temperature: Temperature | None = Field(None, exclude=True)
    # Accepted as what this server does (the oldest turns leave the prompt when the context is full):
    truncation: Literal["auto"] = "auto"
    # A local trace: each response is logged with its workflow and group (there is no tracing dashboard).
    tracing: Literal["auto"] | TracingConfig | None = None
    prompt: None = None
    include: None = None
    expires_at: int = 0

    @field_validator("prompt", "include", mode="before")
    @classmethod
    def _unavailable(cls, value: Any, info: ValidationInfo) -> Any:  # (``object`` is a field here)
        if value is not None:
            raise ValueError(f"{info.field_name} is not available on this server: send null or leave it out")
        return value

    @field_validator("tool_choice")
    @classmethod
    def _tool_choice(cls, value: ToolChoice, info: ValidationInfo) -> ToolChoice:
        check_tool_choice(info.data.get("tools", []), value)
        return value

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
        checked = check_max_output_tokens(value)
        assert checked is not None  # the field is never null
        return checked

    def wants_audio(self) -> bool:
        return "audio" in self.output_modalities

    @property
    def transcribes_only(self) -> bool:
        return self.type == "transcription"

    def to_wire(self) -> dict[str, Any]:
        """The session object clients see: a transcription session has only its input audio (and include)."""
        data = self.model_dump()
        if not self.transcribes_only:
            return data
        return {"type": "transcription", "object": "realtime.transcription_session", "id": data["id"],
                "audio": {"input": data["audio"]["input"]}, "include": data["include"], "expires_at": data["expires_at"]}


READ_ONLY_FIELDS = {"id", "object", "expires_at"}


# Objects an update replaces whole: a new format's rate must not be the old format's.
ATOMIC_FIELDS = {"format"}


def _deep_merge(base: dict[str, Any], update: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in update.items():
        old = merged.get(key)
        # An object of another type (server_vad -> semantic_vad) starts afresh: the old one's fields are not its own.
        same_kind = isinstance(old, dict) and isinstance(value, dict) and value.get("type", old.get("type")) == old.get("type")
        if isinstance(value, dict) and same_kind and key not in ATOMIC_FIELDS:
            merged[key] = _deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def apply_session_update(
    current: SessionConfig, update: Any, *, speech: SpeechOptions | None = None, param: str = "session"
) -> SessionConfig:
    """Merge a partial session object into the current one; fields absent from it are kept.

    `null` clears a nullable field (`turn_detection: null` switches to manual turns). `speech`: the
    voice models' names, which voices and transcription models are checked against.
    """
    if not isinstance(update, dict):
        raise ApiError("invalid_type", f"'{param}' must be an object", param)
    read_only = READ_ONLY_FIELDS & update.keys()
    if read_only:
        field = sorted(read_only)[0]
        raise ApiError("invalid_value", f"'{param}.{field}' cannot be changed", f"{param}.{field}")
    merged = {"temperature": current.temperature, **_deep_merge(current.model_dump(), update)}
    if merged.get("type") == "transcription":
        _as_transcription(merged, update, param)
    try:
        config = SessionConfig.model_validate(merged)
    except ValidationError as exc:
        raise api_error_from_validation(exc, prefix=param, union_tags=TURN_DETECTION_TYPES) from None
    if speech is not None:
        speech.check(config)
    return config


def _as_transcription(merged: dict[str, Any], update: dict[str, Any], param: str) -> None:
    """A transcription session's update holds only its fields; its turns never create or interrupt a response."""
    audio = update.get("audio")
    extra = sorted(update.keys() - TRANSCRIPTION_SESSION_FIELDS)
    extra += sorted(f"audio.{field}" for field in (audio.keys() - {"input"} if isinstance(audio, dict) else ()))
    if extra:
        raise ApiError("unknown_parameter", f"'{param}.{extra[0]}' is not a field of a transcription session.",
                       f"{param}.{extra[0]}")
    if isinstance(audio, dict):
        detection = audio.get("input", {}).get("turn_detection") if isinstance(audio.get("input"), dict) else None
        for field in ("create_response", "interrupt_response"):
            if isinstance(detection, dict) and detection.get(field):
                raise ApiError("invalid_value", "A transcription session creates no responses.",
                               f"{param}.audio.input.turn_detection.{field}")
    audio_input = merged.get("audio", {}).get("input", {})
    if audio_input.get("transcription") is None:
        raise ApiError("invalid_value", "A transcription session needs audio.input.transcription (null would "
                       "transcribe nothing).", f"{param}.audio.input.transcription")
    detection = audio_input.get("turn_detection")
    if isinstance(detection, dict):
        detection["create_response"] = detection["interrupt_response"] = False


def with_intent(initial: dict[str, Any] | None, intent: str | None) -> dict[str, Any] | None:
    """A WebSocket's `?intent=transcription` (as the openai SDK connects for one) opens a transcription session."""
    if intent is None:
        return initial
    if intent != "transcription":
        raise ApiError("invalid_value", f"Unknown intent '{intent}': 'transcription' or none.", "intent")
    if initial is not None and initial.get("type", "transcription") != "transcription":
        raise ApiError("invalid_value", "intent=transcription, but the client secret is for a realtime session.", "intent")
    return {**(initial or {}), "type": "transcription"}
