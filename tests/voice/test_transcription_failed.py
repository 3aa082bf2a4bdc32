"""A turn whose transcription fails gets conversation.item.input_audio_transcription.failed, its item is done
without words, and the session goes on listening (a transcription session here, whose turns never respond)."""

from __future__ import annotations

import asyncio
import base64
import json
from typing import Any

import numpy as np

from gateway.generation.runtime import Runtime
from gateway.platform.config import Settings
from gateway.realtime.session import RealtimeSession
from inference.asr import AsrEngine, Transcript
from media.resample import resample
from tests.conftest import QUESTION
from tests.integration.sdk_types import assert_valid_server_event
from tests.integration.speech import HEARD_AS_SAID, heard_as, with_silence


class FailingFinals:
    """The real Whisper for partials; every final transcription fails, as a model out of memory would."""

    def __init__(self, asr: AsrEngine) -> None:
        self.asr = asr
        self.language = asr.language
        self.fail = True

    async def transcribe(self, audio: np.ndarray, *, final: bool, prompt: str | None = None,
                         stream: str = "", work: str | None = None, language: str | None = None) -> Transcript | None:
        if final and self.fail:
            raise RuntimeError("the decoder ran out of memory")
        return await self.asr.transcribe(audio, final=final, prompt=prompt, stream=stream, work=work, language=language)


async def test_a_failed_transcription_is_reported_and_the_session_goes_on(asr, tts, question_pcm) -> None:
    settings = Settings(load_voice_models=False)
    runtime = Runtime(settings)
    failing = FailingFinals(asr)
    runtime.asr = failing  # type: ignore[assignment]
    session = RealtimeSession(runtime, settings, transport="websocket", speech_factory=None,
                              initial_config={"type": "transcription", "audio": {"input": {"turn_detection": None}}})
    session.start()
    reader = session.outbox.attach()
    events: list[dict[str, Any]] = []

    async def until(kind: str) -> dict[str, Any]:
        while True:
            wire = await asyncio.wait_for(reader.next(), 30)
            assert wire is not None
            event = json.loads(wire)
            assert_valid_server_event(event)
            events.append(event)
            if event["type"] == kind:
                return event

    speech = with_silence(resample(question_pcm, tts.sample_rate, 24000), 24000, 0.2, 0.2).astype("<i2")
    append = json.dumps({"type": "input_audio_buffer.append", "audio": base64.b64encode(speech.tobytes()).decode()})
    try:
        await session.receive(append)
        await session.receive(json.dumps({"type": "input_audio_buffer.commit"}))
        failed = await until("conversation.item.input_audio_transcription.failed")
        assert failed["error"]["code"] == "transcription_failed" and "out of memory" in failed["error"]["message"]
        done = await until("conversation.item.done")
        assert done["item"]["id"] == failed["item_id"] and done["item"]["status"] == "incomplete"
        failing.fail = False  # the model is back: the next turn is transcribed
        await session.receive(append)
        await session.receive(json.dumps({"type": "input_audio_buffer.commit"}))
        completed = await until("conversation.item.input_audio_transcription.completed")
        assert heard_as(completed["transcript"], QUESTION) >= HEARD_AS_SAID, completed["transcript"]
        assert not [event for event in events if event["type"].startswith("response.")]
    finally:
        await session.close()
        runtime.vad_executor.shutdown()
