"""The GPT-Live session factory both Live transports use (live_ws.py's WebSocket, live_webrtc.py's WebRTC): the
checks on a session's configuration, the realtime session it runs on with its Live front, and its history."""

from __future__ import annotations

import time
from typing import Any

from gateway.api.services import Services
from gateway.generation.response_run import ResponseRun
from gateway.platform.config import LiveDelegate
from gateway.platform.model_names import openai_live_model_names
from gateway.protocol.errors import ApiError
from gateway.protocol.live_events import LiveSessionConfig, ResponsesDelegation
from gateway.protocol.responses import ResponseCreateRequest
from gateway.realtime.conversation import Item, new_id
from gateway.realtime.inputs import ItemCreated
from gateway.realtime.live_audio import LiveAudioStream
from gateway.realtime.live_delegation import DELEGATE, DELEGATE_TOOL, check_backend
from gateway.realtime.live_front import FRAME_MS, LiveFront
from gateway.realtime.live_wire import LiveTranslator
from gateway.realtime.outbox import Outbox
from gateway.realtime.session import RealtimeSession
from gateway.realtime.speech_out import PlayoutSpeech
from media.playout import PlayoutBuffer


def require_live_config(svc: Services, config: LiveSessionConfig, event_id: str | None = None) -> None:
    """What session.start's checks cannot know alone: the model names this server answers to, and a Responses
    delegation's settings, checked as the Responses request they become."""
    if config.model not in openai_live_model_names() and config.model not in svc.runtime.model_names:
        raise ApiError("model_not_found", f"Unknown model '{config.model[:100]}'. This server has "
                       f"'{svc.settings.model_name}' (gpt-live-1 and gpt-live-1.1 name it too).", "session.model",
                       status=404, event_id=event_id)
    if isinstance(config.delegation, ResponsesDelegation):
        try:
            check_backend(config.delegation.responses)
            svc.runtime.require_model(str(config.delegation.responses["model"]), "session.delegation.responses.model")
        except ApiError as error:
            error.event_id = event_id
            raise


def open_live(svc: Services, config: LiveSessionConfig, request_id: str | None, audio: LiveAudioStream, owner: str, *,
              wire_audio: bool = True, session_id: str | None = None) -> tuple[RealtimeSession, LiveFront]:
    """A Live session on the realtime core, its playout at `audio`'s rate (WebRTC: the track's, SIP: the call's;
    neither has an audio format on the wire), and its Live front. `session_id`: one announced already (a SIP
    call's webhook)."""
    playout = PlayoutBuffer(audio.rate, audio.rate * FRAME_MS // 1000)
    started_at = time.monotonic()

    def clock_ms() -> int:
        return int((time.monotonic() - started_at) * 1000)

    translator = LiveTranslator(config, config.model, clock_ms, wire_audio=wire_audio)
    session = RealtimeSession(
        svc.runtime, svc.settings, transport="live", speech_factory=PlayoutSpeech.create,
        initial_config=_realtime_config(config, svc.settings.live_delegate), request_id=request_id,
        outbox=Outbox(numbered=False), translate=translator,
        # The id names this replica, so that another replica can pass its sideband and hangup on to it.
        session_id=session_id or new_id(f"sess_{svc.settings.replica_id}"))
    session.attach_playout(playout)

    async def prepare(request: ResponseCreateRequest) -> ResponseRun:
        """A delegated task's Responses request, run by the gateway's own Responses service for the session's key."""
        svc.runtime.require_model(request.model, "session.delegation.responses.model")
        return await ResponseRun.prepare(svc.run_deps(owner), request, owner)

    return session, LiveFront(session, translator, audio, playout, started_at, delegation=config.delegation,
                              prepare=prepare)


def _realtime_config(config: LiveSessionConfig, delegate: LiveDelegate) -> dict[str, Any]:
    """The Realtime session a Live one is: spoken replies, the gateway's own turn-taking (semantic_vad: the
    end-of-turn models, a backchannel does not interrupt), its voice; with a delegation, its tool (`delegate`:
    --live-delegate)."""
    realtime: dict[str, Any] = {"output_modalities": ["audio"],
                                "audio": {"input": {"turn_detection": {"type": "semantic_vad"}}}}
    if config.instructions is not None and config.instructions.strip():
        realtime["instructions"] = config.instructions
    output = config.audio.output if config.audio is not None else None
    if output is not None and isinstance(output.voice, str):
        realtime["audio"]["output"] = {"voice": output.voice}
    if config.delegation is not None:
        # The live model hands tasks on with its one tool. Only when asked (OpenAI's Live gives it to every
        # session): a reply that may be a call is not spoken ahead of the turn's end, which costs a voice turn
        # 250-400 ms of first audio here, and the small embedded model never delegates well.
        realtime["tools"] = [DELEGATE_TOOL]
        # every_turn: the replies to the user's turns are the call (the voice's own replies choose none:
        # live_front.py).
        realtime["tool_choice"] = {"type": "function", "name": DELEGATE} if delegate == "every_turn" else "auto"
    return realtime


def feed_history(session: RealtimeSession, config: LiveSessionConfig) -> None:
    """session.start's `input` into the started session: the conversation so far, as text (a developer's message
    is a system one). Past the conversation's bounds the rest is refused with an error, and the session goes on."""
    for message in config.input or []:
        role = "system" if message.role == "developer" else message.role
        kind = "output_text" if role == "assistant" else "input_text"
        item = Item(id=new_id("item"), type="message", role=role, status="completed",
                    content=[{"type": kind, "text": message.content[0].text}])
        try:
            session.feed(ItemCreated(item))
        except ApiError as error:
            session.send_error(error)
            return
