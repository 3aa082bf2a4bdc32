"""The audio endpoints' requests and answers: transcriptions and translations (multipart forms) and speech
(JSON), in OpenAI's shapes."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.datastructures import FormData, UploadFile

from gateway.protocol.errors import ApiError
from gateway.protocol.validation import api_error_from_validation
from inference.asr import TranscriptSegment

TranscriptionFormat = Literal["json", "text", "srt", "vtt", "verbose_json"]
TRANSCRIPTION_FORMATS: tuple[str, ...] = ("json", "text", "srt", "vtt", "verbose_json")
GRANULARITIES = ("word", "segment")
TRANSCRIPTION_FIELDS = {"file", "model", "language", "prompt", "temperature", "response_format",
                        "timestamp_granularities[]", "stream"}
TRANSLATION_FIELDS = {"file", "model", "prompt", "temperature", "response_format"}  # OpenAI's: no language, no stream
MAX_PROMPT_CHARS = 4096
MAX_SPEECH_CHARS = 4096  # OpenAI's limit on `input`
# Whisper's language codes answer in verbose_json by name, as OpenAI's does ("english").
LANGUAGE_NAMES = {"en": "english", "de": "german", "fr": "french", "es": "spanish", "it": "italian", "nl": "dutch",
                  "pt": "portuguese", "ru": "russian", "zh": "chinese", "ja": "japanese", "ko": "korean"}


@dataclass(frozen=True)
class TranscriptionRequest:
    file: UploadFile
    model: str
    language: str | None
    prompt: str | None
    temperature: float
    response_format: TranscriptionFormat
    granularities: frozenset[str]
    stream: bool


def _one(form: FormData, name: str) -> str | None:
    values = form.getlist(name)
    if len(values) > 1:
        raise ApiError("invalid_value", f"'{name}' is given more than once.", name)
    if not values:
        return None
    value = values[0]
    if not isinstance(value, str):
        raise ApiError("invalid_type", f"'{name}' must be a form field, not a file.", name)
    return value


def parse_transcription_form(form: FormData) -> TranscriptionRequest:
    """Every field checked, and every field this server does not do refused by name (never ignored)."""
    for name in form.keys():
        if name not in TRANSCRIPTION_FIELDS:
            raise ApiError("unknown_parameter", f"Unrecognized request argument supplied: {name}", name)
    files = form.getlist("file")
    if len(files) != 1 or not isinstance(files[0], UploadFile):
        raise ApiError("missing_required_parameter" if not files else "invalid_value",
                       "Send exactly one audio file as the 'file' part.", "file")
    model = _one(form, "model")
    if not model:
        raise ApiError("missing_required_parameter", "Missing required parameter: 'model'.", "model")
    language = _one(form, "language") or None
    if language is not None and (len(language) > 16 or not language.replace("-", "").isalpha()):
        raise ApiError("invalid_value", "'language' must be an ISO-639-1 code such as 'en'.", "language")
    prompt = _one(form, "prompt") or None
    if prompt is not None and len(prompt) > MAX_PROMPT_CHARS:
        raise ApiError("string_above_max_length", f"'prompt' is longer than {MAX_PROMPT_CHARS} characters.", "prompt")
    temperature = _float(_one(form, "temperature"), "temperature", 0.0, 1.0, default=0.0)
    response_format = _one(form, "response_format") or "json"
    if response_format not in TRANSCRIPTION_FORMATS:
        raise ApiError("invalid_value", f"'response_format' must be one of {', '.join(TRANSCRIPTION_FORMATS)}.",
                       "response_format")
    granularities = frozenset(str(value) for value in form.getlist("timestamp_granularities[]"))
    if unknown := granularities - set(GRANULARITIES):
        raise ApiError("invalid_value", f"Unknown timestamp granularity '{sorted(unknown)[0]}': 'word' or 'segment'.",
                       "timestamp_granularities[]")
    if granularities and response_format != "verbose_json":
        raise ApiError("invalid_value", "timestamp_granularities needs response_format 'verbose_json'.",
                       "timestamp_granularities[]")
    stream_value = _one(form, "stream")
    if stream_value not in (None, "true", "false"):
        raise ApiError("invalid_type", "'stream' must be true or false.", "stream")
    stream = stream_value == "true"
    if stream and response_format not in ("json", "text"):
        raise ApiError("invalid_value", "Streamed transcriptions are json or text: transcript.text.delta events, then "
                       "transcript.text.done.", "stream")
    return TranscriptionRequest(files[0], model, language, prompt, temperature, response_format,  # type: ignore[arg-type]
                                granularities, stream)


def parse_translation_form(form: FormData) -> TranscriptionRequest:
    """A translation's fields are a transcription's, fewer: the same checks, and the others refused by name."""
    for name in form.keys():
        if name not in TRANSLATION_FIELDS:
            raise ApiError("unknown_parameter", f"Unrecognized request argument supplied: {name}", name)
    return parse_transcription_form(form)


def _float(raw: str | None, name: str, low: float, high: float, *, default: float) -> float:
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ApiError("invalid_type", f"'{name}' must be a number.", name) from None
    if not low <= value <= high:
        raise ApiError("invalid_value", f"'{name}' must be between {low} and {high}.", name)
    return value


# -- answers ------------------------------------------------------------------------------------------


def transcript_text(segments: list[TranscriptSegment]) -> str:
    return "".join(segment.text for segment in segments).strip()


def _clock(seconds: float, separator: str) -> str:
    ms = max(0, round(seconds * 1000))
    return f"{ms // 3_600_000:02d}:{ms // 60_000 % 60:02d}:{ms // 1000 % 60:02d}{separator}{ms % 1000:03d}"


def srt(segments: list[TranscriptSegment]) -> str:
    blocks = [f"{n}\n{_clock(s.start, ',')} --> {_clock(s.end, ',')}\n{s.text.strip()}\n"
              for n, s in enumerate(segments, start=1)]
    return "\n".join(blocks)


def vtt(segments: list[TranscriptSegment]) -> str:
    blocks = [f"{_clock(s.start, '.')} --> {_clock(s.end, '.')}\n{s.text.strip()}\n" for s in segments]
    return "WEBVTT\n\n" + "\n".join(blocks)


def verbose_json(segments: list[TranscriptSegment], language: str, duration: float, granularities: frozenset[str]) -> dict[str, Any]:
    """TranscriptionVerbose: segments unless only words were asked for, words when asked for."""
    body: dict[str, Any] = {
        "language": LANGUAGE_NAMES.get(language, language),
        "duration": round(duration, 3),
        "text": transcript_text(segments),
        "usage": {"type": "duration", "seconds": round(duration, 3)},
    }
    if not granularities or "segment" in granularities:
        body["segments"] = [{
            "id": s.id, "seek": s.seek, "start": round(s.start, 3), "end": round(s.end, 3), "text": s.text,
            "tokens": s.tokens, "temperature": s.temperature, "avg_logprob": s.avg_logprob,
            "compression_ratio": s.compression_ratio, "no_speech_prob": s.no_speech_prob,
        } for s in segments]  # fmt: skip
    if "word" in granularities:
        body["words"] = [{"word": w.word.strip(), "start": round(w.start, 3), "end": round(w.end, 3)}
                         for s in segments for w in s.words]
    return body


def translation_verbose_json(segments: list[TranscriptSegment], language: str, duration: float) -> dict[str, Any]:
    """TranslationVerbose: a transcription's without words or usage; `language` is the one Whisper heard."""
    body = verbose_json(segments, language, duration, frozenset({"segment"}))
    del body["usage"]
    return body


def sse(event: dict[str, Any]) -> bytes:
    return f"data: {json.dumps(event, ensure_ascii=True, separators=(',', ':'))}\n\n".encode()


# -- speech -------------------------------------------------------------------------------------------


class VoiceId(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    id: str = Field(min_length=1, max_length=64)


class SpeechRequest(BaseModel):
    """POST /v1/audio/speech. `stream_format` "audio" streams the encoded file itself; "sse" sends the same
    bytes as base64 `speech.audio.delta` events, then `speech.audio.done` (OpenAI's two stream formats, any
    `response_format` in either). `instructions` (steering a voice by prompt) is not something Piper does:
    a non-empty one is refused by name rather than ignored."""

    model_config = ConfigDict(extra="forbid", strict=True)
    model: str = Field(min_length=1, max_length=256)
    input: str = Field(max_length=MAX_SPEECH_CHARS)
    voice: str | VoiceId
    instructions: str = Field("", max_length=MAX_SPEECH_CHARS,
                              description="Refused unless empty: Piper voices cannot be steered by a prompt.")
    response_format: Literal["mp3", "opus", "aac", "flac", "wav", "pcm"] = "mp3"
    speed: float = Field(1.0, ge=0.25, le=4.0)
    stream_format: Literal["audio", "sse"] = "audio"

    @property
    def voice_name(self) -> str:
        return self.voice.id if isinstance(self.voice, VoiceId) else self.voice


def parse_speech_request(payload: dict[str, Any]) -> SpeechRequest:
    if isinstance(payload.get("speed"), int) and not isinstance(payload.get("speed"), bool):
        payload = {**payload, "speed": float(payload["speed"])}  # JSON has one number type; 1 is 1.0
    try:
        request = SpeechRequest.model_validate(payload)
    except ValidationError as exc:
        error = api_error_from_validation(exc)
        if error.param == "input" and isinstance(payload.get("input"), str):
            error.code = "string_above_max_length"
            error.message = f"'input' is longer than the {MAX_SPEECH_CHARS} characters this server speaks at once."
        raise error from None
    if request.instructions:
        raise ApiError("unsupported_parameter", "'instructions' is not available: this server speaks with Piper, "
                       "whose voices cannot be steered by a prompt (tone, accent, emotion). Leave it out or empty.",
                       "instructions")
    if not request.input.strip():
        raise ApiError("invalid_value", "'input' is empty: there is nothing to say.", "input")
    return request
