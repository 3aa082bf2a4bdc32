"""POST /v1/audio/transcriptions, /translations and /speech, and GET /v1/audio/voices, as OpenAI's (voices: ours).

Model work runs on the ASR and TTS engines' own workers at background priority: a live session's
transcripts and speech always go first (inference/asr.py, inference/tts.py). Decoding an upload and
encoding speech run in worker threads too; the event loop only moves bytes.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from typing import Any

import numpy as np
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.datastructures import FormData
from starlette.exceptions import HTTPException
from starlette.formparsers import MultiPartException

from gateway.api import audio_requests as proto
from gateway.api.caller import AuthorizedCaller
from gateway.api.http_bodies import read_json_object
from gateway.api.openapi import error_responses, json_body, request_body
from gateway.api.services import Services, services
from gateway.platform.event_log import log_event
from gateway.platform.model_names import openai_speech_names, openai_transcription_names
from gateway.protocol.errors import ApiError
from inference.asr import AsrEngine, LongTranscription, TranscriptSegment
from inference.text import ClauseSplitter
from inference.tts import TtsEngine
from media.audio_files import OUTPUT_RATE, AudioFileError, StreamEncoder, decode_file
from media.resample import Resampler

log = logging.getLogger(__name__)
router = APIRouter()

SPEECH_MODEL = "piper"  # the speech endpoint's own model name (OpenAI's tts-1, gpt-4o-mini-tts, ... select it too)
MAX_FORM_FIELDS = 16


def _asr(svc: Services) -> AsrEngine:
    svc.runtime.require_ready()
    if svc.runtime.asr is None:
        raise ApiError("voice_unavailable", "Transcription needs the voice models, which are not loaded.",
                       type="server_error", status=503)
    return svc.runtime.asr


def _tts(svc: Services) -> TtsEngine:
    svc.runtime.require_ready()
    if svc.runtime.tts is None:
        raise ApiError("voice_unavailable", "Speech needs the voice models, which are not loaded.",
                       type="server_error", status=503)
    return svc.runtime.tts


TRANSCRIPTION_BODY = request_body({"multipart/form-data": {"schema": {
    "type": "object",
    "required": ["file", "model"],
    "properties": {
        "file": {"type": "string", "format": "binary", "description": "Audio in any format FFmpeg reads."},
        "model": {"type": "string", "description": "The installed Whisper's name, or OpenAI's (whisper-1, ...)."},
        "language": {"type": "string"},
        "prompt": {"type": "string"},
        "temperature": {"type": "number", "minimum": 0, "maximum": 1},
        "response_format": {"type": "string", "enum": list(proto.TRANSCRIPTION_FORMATS)},
        "timestamp_granularities[]": {"type": "array", "items": {"type": "string", "enum": list(proto.GRANULARITIES)}},
        "stream": {"type": "boolean"},
    },
}}})  # fmt: skip


@router.post("/v1/audio/transcriptions", openapi_extra=TRANSCRIPTION_BODY,
             responses=error_responses(400, 401, 404, 413, 415, 429, 503))
async def create_transcription(request: Request, caller: AuthorizedCaller) -> Response:
    svc = services(request)
    asr = _asr(svc)
    body, data = await _read_form(request, proto.parse_transcription_form)
    _check_transcription_model(svc, asr, body)
    audio = await _decode(svc, data)
    started = time.perf_counter()
    transcription = await asr.transcribe_long(audio, language=body.language, prompt=body.prompt,
                                              temperature=body.temperature, word_timestamps="word" in body.granularities)
    if body.stream:
        return StreamingResponse(_stream_transcript(transcription, started), media_type="text/event-stream",
                                 headers={**caller.headers, "cache-control": "no-cache"})
    async with contextlib.aclosing(transcription.segments) as stream:
        segments = [segment async for segment in stream]
    _log_transcription(transcription, segments, started, stream=False)
    return _transcription_answer(body, transcription, segments, caller.headers)


async def _read_form(
    request: Request, parse: Callable[[FormData], proto.TranscriptionRequest]
) -> tuple[proto.TranscriptionRequest, bytes]:
    if request.headers.get("content-type", "").split(";")[0].strip().lower() != "multipart/form-data":
        raise ApiError("unsupported_media_type", "Send the audio as multipart/form-data with a 'file' part.", status=415)
    try:
        form_context = request.form(max_files=1, max_fields=MAX_FORM_FIELDS, max_part_size=proto.MAX_PROMPT_CHARS * 4)
        async with form_context as form:
            body = parse(form)
            return body, await body.file.read()
    except (MultiPartException, HTTPException) as exc:
        message = exc.message if isinstance(exc, MultiPartException) else str(exc.detail)
        raise ApiError("invalid_multipart", f"The multipart body cannot be read: {message}") from None


async def _decode(svc: Services, data: bytes) -> np.ndarray:
    try:
        return await asyncio.to_thread(decode_file, data, max_seconds=svc.settings.max_transcription_audio_s)
    except AudioFileError as exc:
        raise ApiError("invalid_audio", f"{exc} Send audio in a format FFmpeg reads (wav, mp3, ogg, flac, m4a, webm, ...).",
                       "file") from None


def _check_transcription_model(svc: Services, asr: AsrEngine, body: proto.TranscriptionRequest) -> None:
    speech = svc.runtime.speech_options
    if body.model != speech.transcription_model and body.model not in openai_transcription_names():
        raise ApiError("model_not_found", f"The model '{body.model}' does not exist. This server transcribes with "
                       f"'{speech.transcription_model}' (OpenAI's transcription model names also select it).",
                       "model", status=404)
    if body.language is not None and asr.language is not None and body.language != asr.language:
        raise ApiError("invalid_value", f"This server's Whisper model transcribes '{asr.language}' only; language "
                       f"'{body.language}' is not available.", "language")


TRANSLATION_BODY = request_body({"multipart/form-data": {"schema": {
    "type": "object",
    "required": ["file", "model"],
    "properties": {
        "file": {"type": "string", "format": "binary", "description": "Audio in any format FFmpeg reads."},
        "model": {"type": "string", "description": "The installed Whisper's name, or OpenAI's (whisper-1, ...)."},
        "prompt": {"type": "string", "description": "In English, as the translation is."},
        "temperature": {"type": "number", "minimum": 0, "maximum": 1},
        "response_format": {"type": "string", "enum": list(proto.TRANSCRIPTION_FORMATS)},
    },
}}})  # fmt: skip


@router.post("/v1/audio/translations", openapi_extra=TRANSLATION_BODY,
             description="Speech in any language as English text: Whisper's own translation, which a multilingual "
                         "model does. An English-only model (the embedded tiny.en) refuses it with 400.",
             responses=error_responses(400, 401, 404, 413, 415, 429, 503))
async def create_translation(request: Request, caller: AuthorizedCaller) -> Response:
    svc = services(request)
    asr = _asr(svc)
    body, data = await _read_form(request, proto.parse_translation_form)
    _check_transcription_model(svc, asr, body)
    if not asr.multilingual:
        model = svc.runtime.speech_options.transcription_model
        raise ApiError("unsupported_model", f"Translation is not available: this server's Whisper model ('{model}') "
                       "is English-only. It transcribes English speech (POST /v1/audio/transcriptions) and cannot "
                       "translate other languages; a multilingual Whisper (--asr-model) translates.", "model")
    audio = await _decode(svc, data)
    started = time.perf_counter()
    transcription = await asr.transcribe_long(audio, prompt=body.prompt, temperature=body.temperature, task="translate")
    async with contextlib.aclosing(transcription.segments) as stream:
        segments = [segment async for segment in stream]
    log_event("audio.translation", audio_s=round(transcription.duration, 3), segments=len(segments),
              language=transcription.language, duration_ms=round((time.perf_counter() - started) * 1000, 1),
              content={"translation": proto.transcript_text(segments)})
    match body.response_format:
        case "verbose_json":
            return JSONResponse(proto.translation_verbose_json(segments, transcription.language, transcription.duration),
                                headers=caller.headers)
        case "json":
            return JSONResponse({"text": proto.transcript_text(segments)}, headers=caller.headers)
    # text, srt and vtt: as a transcription's
    return _transcription_answer(body, transcription, segments, caller.headers)


def _transcription_answer(
    body: proto.TranscriptionRequest, transcription: LongTranscription, segments: list[TranscriptSegment], headers: dict[str, str]
) -> Response:
    text = proto.transcript_text(segments)
    match body.response_format:
        case "text":
            return PlainTextResponse(text + "\n", headers=headers)
        case "srt":
            return PlainTextResponse(proto.srt(segments), headers=headers)
        case "vtt":
            return PlainTextResponse(proto.vtt(segments), media_type="text/vtt", headers=headers)
        case "verbose_json":
            return JSONResponse(proto.verbose_json(segments, transcription.language, transcription.duration,
                                                   body.granularities), headers=headers)
    usage = {"type": "duration", "seconds": round(transcription.duration, 3)}
    return JSONResponse({"text": text, "usage": usage}, headers=headers)


async def _stream_transcript(transcription: LongTranscription, started: float) -> AsyncIterator[bytes]:
    """transcript.text.delta per segment as its window is decoded, then transcript.text.done. A client that
    leaves stops the transcription before its next window."""
    segments: list[TranscriptSegment] = []
    status = "client_left"  # unless it gets to the end
    try:
        async with contextlib.aclosing(transcription.segments) as stream:
            async for segment in stream:
                delta = segment.text if segments else segment.text.lstrip()
                segments.append(segment)
                yield proto.sse({"type": "transcript.text.delta", "delta": delta})
        yield proto.sse({"type": "transcript.text.done", "text": proto.transcript_text(segments)})
        status = "completed"
    finally:
        _log_transcription(transcription, segments, started, stream=True, status=status)


def _log_transcription(transcription: LongTranscription, segments: list[TranscriptSegment], started: float, *, stream: bool,
                       status: str = "completed") -> None:
    log_event("audio.transcription", audio_s=round(transcription.duration, 3), segments=len(segments), stream=stream,
              status=status, duration_ms=round((time.perf_counter() - started) * 1000, 1),
              content={"transcript": proto.transcript_text(segments)})


SPEECH_CONTENT_TYPES = ("audio/mpeg", "audio/ogg", "audio/aac", "audio/flac", "audio/wav", "audio/pcm")


@router.post("/v1/audio/speech", openapi_extra=json_body(proto.SpeechRequest),
             responses={200: {"description": "The audio, streamed as it is synthesized: the file itself "
                                             "(stream_format 'audio'), or speech.audio.delta events with its bytes in "
                                             "base64, then speech.audio.done (stream_format 'sse').",
                              "content": {**{content_type: {"schema": {"type": "string", "format": "binary"}}
                                             for content_type in SPEECH_CONTENT_TYPES},
                                          "text/event-stream": {"schema": {"type": "string"}}}},
                        **error_responses(400, 401, 404, 413, 429, 503)})
async def create_speech(request: Request, caller: AuthorizedCaller) -> Response:
    svc = services(request)
    _, payload = await read_json_object(request)
    body = proto.parse_speech_request(payload)
    if body.model != SPEECH_MODEL and body.model not in openai_speech_names():
        raise ApiError("model_not_found", f"The model '{body.model}' does not exist. This server speaks with "
                       f"'{SPEECH_MODEL}' (OpenAI's speech model names also select it).", "model", status=404)
    voice = svc.runtime.voices.resolve(body.voice_name)
    tts = _tts(svc)
    splitter = ClauseSplitter()
    clauses = [*splitter.push(body.input), *splitter.flush()]
    if not clauses:
        raise ApiError("invalid_value", "'input' has nothing speakable in it (no letters or digits).", "input")
    encoder = StreamEncoder(body.response_format)
    speech = _Speech(tts, clauses, voice, body.speed, encoder, body.stream_format)
    if body.stream_format == "sse":
        return StreamingResponse(speech.events(), media_type="text/event-stream",
                                 headers={**caller.headers, "cache-control": "no-cache"})
    return StreamingResponse(speech.audio(), media_type=encoder.content_type, headers=caller.headers)


class _Speech:
    """One request's synthesis, clause by clause: each clause's audio leaves as soon as Piper has made it
    (the first after a few words). A client that leaves stops the synthesis at the next hop."""

    def __init__(self, tts: TtsEngine, clauses: list[str], voice: str, speed: float, encoder: StreamEncoder,
                 stream_format: str) -> None:
        self.tts, self.clauses, self.voice, self.speed, self.encoder = tts, clauses, voice, speed, encoder
        self.stream_format = stream_format
        self.phoneme_ids = 0  # Piper's input tokens, counted on its worker as each sentence is synthesized

    def _count(self, phoneme_ids: int) -> None:
        self.phoneme_ids += phoneme_ids

    async def audio(self) -> AsyncGenerator[bytes, None]:
        """The encoded file's bytes, as the encoder gives them."""
        tts, voice, encoder = self.tts, self.voice, self.encoder
        started = time.perf_counter()
        resampler = Resampler(tts.sample_rate_of(voice), OUTPUT_RATE)
        samples = 0

        def encode(pcm: np.ndarray, last: bool) -> bytes:
            resampled = resampler.process(pcm)
            if last:
                resampled = np.concatenate([resampled, resampler.flush()])
            return encoder.write(resampled) + (encoder.close() if last else b"")

        status = "client_left"  # unless it gets to the end
        try:
            for clause in self.clauses:
                synthesis = tts.synthesize(clause, speed=self.speed, voice=voice, priority="background",
                                           on_phonemes=self._count)
                async with contextlib.aclosing(synthesis) as pcms:
                    async for pcm in pcms:
                        samples += len(pcm)
                        if data := await asyncio.to_thread(encode, pcm, False):
                            yield data
            if data := await asyncio.to_thread(encode, np.zeros(0, dtype=np.int16), True):
                yield data
            status = "completed"
        finally:
            log_event("audio.speech", voice=voice, format=encoder.format, stream_format=self.stream_format,
                      clauses=len(self.clauses), status=status, audio_s=round(samples / tts.sample_rate_of(voice), 3),
                      duration_ms=round((time.perf_counter() - started) * 1000, 1))

    async def events(self) -> AsyncIterator[bytes]:
        """OpenAI's stream_format "sse": the same bytes as audio(), base64 in speech.audio.delta events, then
        speech.audio.done with the usage. Piper reads phoneme ids and makes samples, not tokens: its input
        tokens are the phoneme ids, and it has no output tokens (as a Realtime response's audio_tokens)."""
        async with contextlib.aclosing(self.audio()) as audio:
            async for data in audio:
                yield proto.sse({"type": "speech.audio.delta", "audio": base64.b64encode(data).decode("ascii")})
        usage = {"input_tokens": self.phoneme_ids, "output_tokens": 0, "total_tokens": self.phoneme_ids}
        yield proto.sse({"type": "speech.audio.done", "usage": usage})


@router.get("/v1/audio/voices", responses=error_responses(401, 429))
async def list_voices(request: Request, caller: AuthorizedCaller) -> JSONResponse:
    """Ours, not OpenAI's: the installed Piper voices, the OpenAI voice names that select each, and once the
    voices are loaded their language (espeak-ng's) and sample rate."""
    svc = services(request)
    voices, tts = svc.runtime.voices, svc.runtime.tts
    data: list[dict[str, Any]] = []
    for name in voices.installed:
        voice: dict[str, Any] = {"id": name, "object": "voice", "default": name == voices.default,
                                 "openai_voices": sorted(voices.aliases_of(name))}
        if tts is not None:  # loaded: what the voice is
            voice.update(language=tts.language_of(name), sample_rate=tts.sample_rate_of(name))
        data.append(voice)
    return JSONResponse({"object": "list", "data": data}, headers=caller.headers)
