"""A GPT-Live client's side of a realtime session: its events in, the assistant's audio and words out as they play.

Live has no Realtime items, buffers or responses to manage: the client streams its microphone, the server decides
the turns (the session's VAD, end-of-turn judges and barge-in: a backchannel over the reply pauses it and it plays
on), and it speaks. So the reply's audio is paced here, 20 ms at a time, from the session's playout buffer, a
little ahead of real time: what was sent is what the user heard when they cut in, and the reply is truncated to it
(over WebRTC the track paces it instead, and tells `played`). The assistant's words follow the audio: each word goes
out as the audio that carries it is sent, placed on the session's timeline, and words never played are never sent.
A sideband hears the audio both ways (live_reflection.py).

The client's events become the session's inputs: appended audio (silence while muted) goes to the voice pipeline,
appended instructions extend the session's, thinking is a silent system note in the conversation, commentary a
note the voice says in its own words once it is free (as it says a delegated task's result: live_delegation.py).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import logging
import time

import numpy as np

from gateway.platform import metrics
from gateway.protocol.client_events import ResponseParams
from gateway.protocol.errors import ApiError
from gateway.protocol.live_events import (
    ClientDelegation,
    CommentaryAppend,
    InputAudioAppend,
    InputAudioMute,
    InputAudioUnmute,
    InstructionsAppend,
    LiveClientEvent,
    OutputAudioFixturePlay,
    ResponseCreate,
    ResponseItemCreate,
    ResponsesDelegation,
    SessionClose,
    SessionStart,
    SessionUpdate,
    ThinkingAppend,
    decode_live_event,
)
from gateway.protocol.session_config import MAX_INSTRUCTIONS_CHARS
from gateway.realtime.conversation import Item, heard_text, new_id
from gateway.realtime.inputs import ConfigChanged, ItemCreated, OutputClearRequested, ReplyWhenFree, ResponseRequested
from gateway.realtime.live_audio import LiveAudioStream
from gateway.realtime.live_delegation import DELEGATE, LiveDelegations, PrepareRun
from gateway.realtime.live_reflection import SidebandReflection
from gateway.realtime.live_wire import LiveTranslator
from gateway.realtime.response_events import Event
from gateway.realtime.session import DTMF_DIGITS, RealtimeSession
from media.codecs import pcm16_to_array
from media.frames import AudioChunk
from media.playout import PlayoutBuffer, PlayoutFrame
from media.resample import resample

log = logging.getLogger(__name__)

FRAME_MS = 20
LEAD_MS = 60  # audio is sent this far ahead of real time: a client's jitter never starves its player
MAX_LAG_MS = 100  # a pacer this late (a stalled loop) starts its clock again rather than bursting to catch up
ACK_TOKENS = 24  # an acknowledgement is a few words
FIXTURE_RATE = 24000  # an audio fixture's PCM16, whatever the session's format
MAX_FIXTURE_S = 30


class LiveFront:
    def __init__(self, session: RealtimeSession, translator: LiveTranslator, audio: LiveAudioStream,
                 playout: PlayoutBuffer, started_at: float, *, delegation: ClientDelegation | ResponsesDelegation | None,
                 prepare: PrepareRun | None) -> None:
        self.session = session
        self.translator = translator
        self.audio = audio
        self.playout = playout
        self.started_at = started_at  # time.monotonic() at the session's start: 0 on its timeline
        self.muted = False
        self._fixture: str | None = None  # the audio fixture playing (its item id in the playout), if any
        self._fixture_audio: np.ndarray | None = None  # its audio, until the reply it cuts has stopped
        self.delegations = LiveDelegations(
            delegation, prepare=prepare, say=self._say, speak=self._speak, acknowledge=self._acknowledge,
            report=session.send_error, clock_ms=self.clock_ms) if delegation is not None else None
        translator.on_call = self._function_called
        self._pacer: asyncio.Task[None] | None = None
        self._playing: Item | None = None  # the reply whose audio is going out
        self._words_sent = 0  # of its words
        self._after_fixture: list[str] = []  # notes that came while a fixture played: the core's once it has played
        self.reflection = SidebandReflection(session.outbox, playout.sample_rate, self.clock_ms)

    def clock_ms(self) -> int:
        return int((time.monotonic() - self.started_at) * 1000)

    def start(self) -> None:
        self._pacer = asyncio.create_task(self._pace(), name=f"live pacer {self.session.id}")

    async def close(self) -> None:
        if self.delegations is not None:
            await self.delegations.close()
        if self._pacer is not None:
            self._pacer.cancel()
            await asyncio.gather(self._pacer, return_exceptions=True)
            self._pacer = None

    # -- the client's events ------------------------------------------------------------------------------------

    async def receive(self, raw: str | bytes) -> None:
        """One client message; a refused one is an `error` event and the session goes on."""
        try:
            event = decode_live_event(raw, max_bytes=self.session.settings.max_event_bytes)
        except ApiError as error:
            self.session.send_error(error)
            return
        metrics.CLIENT_EVENTS.labels(event.type).inc()
        self.session.last_activity = time.monotonic()  # --session-idle-timeout-s counts from here
        try:
            self._handle(event)
        except ApiError as error:
            error.event_id = error.event_id or event.event_id
            self.session.send_error(error)
        await self.session.settle()
        if self._fixture is not None and self._fixture_audio is not None:  # the cut reply's task has ended
            self.playout.write(self._fixture, self._fixture_audio)
            self._fixture_audio = None

    def _handle(self, event: LiveClientEvent) -> None:
        session = self.session
        match event:
            case InputAudioAppend():
                self._append(event)
            case InputAudioMute() | InputAudioUnmute():
                self.muted = isinstance(event, InputAudioMute)
                self._say({"type": "session.input_audio.muted" if self.muted else "session.input_audio.unmuted"},
                          event)
            case OutputAudioFixturePlay():
                self._play_fixture(event)
            case InstructionsAppend():
                self._check_delegation(event)
                config = session.config
                instructions = f"{config.instructions}\n\n{event.content}".strip()
                if len(instructions) > MAX_INSTRUCTIONS_CHARS:
                    raise ApiError("invalid_value", f"The session's instructions would pass {MAX_INSTRUCTIONS_CHARS} "
                                   "characters.", "content")
                session.feed(ConfigChanged(config.model_copy(update={"instructions": instructions})))
                self._appended("session.instructions.appended", event)
            case ThinkingAppend():
                self._check_delegation(event)
                session.feed(ItemCreated(_note(f"Context for you (do not read it out): {event.content}")))
                self._appended("session.thinking.appended", event)
            case CommentaryAppend():
                self._check_delegation(event)
                self._appended("session.commentary.appended", event)
                self._speak(f"Tell the user, in your own words: {event.content}")
            case ResponseItemCreate():
                self._delegations("response.item.create").item_create(event.item)
            case ResponseCreate():
                self._delegations("response.create").create()
            case SessionUpdate():
                if event.session.delegation is not None:
                    if self.delegations is None:
                        raise ApiError("invalid_value", "This session started without a delegation, and its type "
                                       "cannot change.", "session.delegation.type")
                    delegations = self.delegations
                    delegations.update(event.session.delegation)
                    self.translator.delegation_changed(delegations.config.model_dump(exclude_none=True))
                self._say({"type": "session.updated", "session": self.translator.resource}, event)
            case SessionStart():
                raise ApiError("session_already_started", "session.start was already sent on this connection.",
                               "type")
            case SessionClose():
                self.hang_up(event)

    def hang_up(self, cause: LiveClientEvent | None = None) -> None:
        """session.close, or a hangup: session.closed, and the session ends once its last events are out
        (channel.run_session)."""
        self.closed_by("close_requested", cause)

    def closed_by(self, reason: str, cause: LiveClientEvent | None = None) -> None:
        """session.closed for `reason` (a SIP caller's BYE is `remote_hangup`), once: a closed outbox sends nothing."""
        self._say(self.translator.closed(reason), cause)
        self.session.outbox.close()

    def _append(self, event: InputAudioAppend) -> None:
        self.hear(self.audio.decode(event.audio))

    def hear(self, chunk: AudioChunk) -> None:
        """The user's audio at the session's input rate, appended on the WebSocket or from the WebRTC track: a
        sideband hears it as it came (before the 16 kHz the model hears), the model hears silence while muted."""
        voice = self.session.voice
        if voice is None:
            raise ApiError("voice_unavailable", "This server runs without its voice models.", "type")
        if self.translator.input_offset_ms is None:
            self.translator.input_offset_ms = max(0, self.clock_ms() - round(chunk.duration_ms))
        self.reflection.input(chunk)
        chunk = self.audio.to_asr(chunk)
        if self.muted or self._fixture is not None:  # the model hears silence: the turns' timeline goes on
            chunk = AudioChunk(np.zeros_like(chunk.pcm), chunk.sample_rate)
        voice.append(chunk)

    def dtmf_received(self, digit: str) -> None:
        """A keypad digit a SIP caller pressed: transport.dtmf.received, which a sideband gets (a call has no
        front end)."""
        if len(digit) != 1 or digit not in DTMF_DIGITS:
            raise ApiError("invalid_value", f"'{digit[:8]}' is not a keypad digit ({DTMF_DIGITS}).", "event")
        self._say({"type": "transport.dtmf.received", "event": digit})

    def _check_delegation(self, event: InstructionsAppend | ThinkingAppend | CommentaryAppend) -> None:
        """Context tied to a delegation names one the application was given (client delegation); any appended
        thinking or commentary says more than a pending acknowledgement would. None while a fixture plays."""
        if self._fixture is not None:
            raise ApiError("fixture_active", f"{event.type} is refused while an audio fixture plays.", "type")
        if self.delegations is not None and not isinstance(event, InstructionsAppend):
            self.delegations.cancel_acks()
        if event.delegation_id is None:
            return
        if self.delegations is None or not self.delegations.knows(event.delegation_id):
            raise ApiError("invalid_value", f"Unknown delegation '{event.delegation_id[:64]}': only a client "
                           "delegation's id (session.delegation.created) can be given.", "delegation_id")

    def _delegations(self, what: str) -> LiveDelegations:
        if self.delegations is None:
            raise ApiError("invalid_value", f"{what} needs a delegation (session.start's session.delegation).", "type")
        return self.delegations

    # -- what the voice says of its own accord ----------------------------------------------------------------

    def _free(self) -> bool:
        """Nobody is speaking, or about to (the core's rule), and no fixture plays."""
        return self.session.core.free and self._fixture is None

    def _speak(self, note: str) -> None:
        """The voice says `note`, in its own words, once it is free (commentary, a delegation's result): the core
        says it when nobody speaks; a note that comes while a fixture plays goes to it once that has played."""
        if self._fixture is not None:
            self._after_fixture.append(note)
        else:
            self.session.feed(ReplyWhenFree(_note(note), ResponseParams(tool_choice="none")))

    def _acknowledge(self, text: str) -> None:
        if self._free():
            config = self.session.config
            # The live conversation learns of the task (a client's response.create may be the first it hears of it).
            self.session.feed(ItemCreated(_note("A request of the user's is being worked on in the background.")))
            self.session.feed(ResponseRequested(ResponseParams(
                instructions=f"{config.instructions}\n\n{text}".strip(), max_output_tokens=ACK_TOKENS,
                tool_choice="none")))

    def _function_called(self, name: str, call_id: str, arguments: str) -> None:
        """The live model called a tool (its reply's response.done, sent inside the core's step): handled after it."""
        if name == DELEGATE and self.delegations is not None:
            asyncio.get_running_loop().call_soon(self._delegate, call_id, arguments)
        else:
            log.warning("live session %s: the model called an unknown tool", self.session.id)

    def _delegate(self, call_id: str, arguments: str) -> None:
        assert self.delegations is not None
        try:
            task = str(json.loads(arguments).get("task") or arguments)
        except (ValueError, AttributeError):
            task = arguments
        output = Item(id=new_id("item"), type="function_call_output", call_id=call_id,
                      output="Delegated. The result will come back to you; keep talking with the user meanwhile.")
        try:
            self.session.feed(ItemCreated(output))
            self.delegations.delegated(task)
        except ApiError as error:
            self.session.send_error(error)

    def _appended(self, kind: str, event: LiveClientEvent) -> None:
        now = self.clock_ms()
        self._say({"type": kind, "start_ms": now, "end_ms": now}, event)

    def _say(self, live_event: Event, cause: LiveClientEvent | None = None) -> None:
        """A Live event of the front's own (not the core's): straight to the outbox."""
        if cause is not None and cause.event_id is not None:
            live_event["client_event_id"] = cause.event_id
        audio = live_event["type"] == "session.output_audio.delta"  # a sideband has its own copy (reflection)
        self.session.outbox.send(live_event, identified=not audio, tapped=not audio)

    # -- the reply's audio and words, as they play ------------------------------------------------------------

    async def _pace(self) -> None:
        loop = asyncio.get_running_loop()
        start = loop.time()
        frames = 0
        while True:
            wait = start + (frames * FRAME_MS - LEAD_MS) / 1000 - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
            elif wait < -MAX_LAG_MS / 1000:
                start = loop.time() - frames * FRAME_MS / 1000
            frames += 1
            try:
                self._send_frame()
            except Exception:  # the pacer is the session's voice: a defect here is logged, and it plays on
                log.exception("live session %s: sending a frame failed", self.session.id)

    def _send_frame(self) -> None:
        frame = self.playout.read_frame()
        if frame.started:
            self.playout_event("started", frame.item_id)
        if frame.audio_samples:
            self._say({"type": "session.output_audio.delta", "delta": self.audio.encode(frame.pcm[:frame.audio_samples])})
        if frame.audio_samples or frame.stopped:
            self.played(frame)
        if frame.stopped:
            self.playout_event("stopped", frame.item_id)

    def playout_event(self, kind: str, item_id: str | None) -> None:
        """The playout started or stopped (this pacer's, or the WebRTC track's): a reply's marks go to the session;
        a fixture's end says it played (fixture.played) and lets the model speak and hear again."""
        if self._fixture is None:
            self.session.on_playout_event(kind, item_id)
        elif kind == "stopped":
            self._fixture = None
            self._say({"type": "session.output_audio.fixture.played"})
            notes, self._after_fixture = self._after_fixture, []
            for note in notes:
                self._speak(note)

    def _play_fixture(self, event: OutputAudioFixturePlay) -> None:
        """Checked whole first; then the reply speaking is cut (as an interruption is), the input is silenced, and
        the recording plays through the session's output; inference waits until it has played."""
        if self._fixture is not None:
            raise ApiError("fixture_active", "An audio fixture is already playing; wait for fixture.played.", "type")
        try:
            data = base64.b64decode(event.audio, validate=True)
        except (binascii.Error, ValueError):
            raise ApiError("invalid_audio", "'audio' is not valid base64.", "audio") from None
        if not data or len(data) % 2:
            raise ApiError("invalid_audio", "A fixture is raw PCM16 at 24 kHz: an even, non-zero number of bytes.",
                           "audio")
        if len(data) > MAX_FIXTURE_S * FIXTURE_RATE * 2:
            raise ApiError("invalid_audio", f"A fixture is at most {MAX_FIXTURE_S} s.", "audio")
        pcm = resample(pcm16_to_array(data), FIXTURE_RATE, self.playout.sample_rate)
        self.session.feed(OutputClearRequested())  # the reply stops where it was heard, as in a barge-in
        self._fixture = new_id("fixture")
        self._fixture_audio = pcm  # queued once the reply has stopped (receive settles it first)
        self._say({"type": "session.output_audio.fixture.playing"}, event)

    def played(self, frame: PlayoutFrame) -> None:
        """A frame of audio has gone out, or the audio stopped (the pacer's, or the WebRTC track's that paces
        it): its words follow, and a sideband hears it."""
        if frame.audio_samples:
            self.reflection.output(frame.pcm[:frame.audio_samples])
            if frame.item_id is not None:
                self._say_words(frame.item_id)
        if frame.stopped and self._playing is not None:  # it played out: its last words, to the end of its audio
            self._say_words(self._playing.id, until_ms=self._playing.audio_ms_sent)

    def _say_words(self, item_id: str, until_ms: float | None = None) -> None:
        """The reply's words whose audio has now been sent (a clause's words pro rata over its audio)."""
        item = self._reply(item_id)
        if item is None:
            return
        words = heard_text(item.spoken, self.playout.played_ms(item_id) if until_ms is None else until_ms).split()
        fresh = words[self._words_sent:]
        if not fresh:
            return
        delta = " ".join(fresh)
        if self._words_sent:
            delta = f" {delta}"
        self._words_sent = len(words)
        now = self.clock_ms()
        self._say({"type": "session.output_transcript.delta", "delta": delta, "start_ms": max(0, now - FRAME_MS),
                   "end_ms": now})

    def _reply(self, item_id: str) -> Item | None:
        if self._playing is not None and self._playing.id == item_id:
            return self._playing
        active = self.session.active
        if active is not None and active.events.item.id == item_id:
            item = active.events.item
        else:
            try:
                item = self.session.conversation.get(item_id)
            except ApiError:
                return None  # an out-of-band reply that has ended: its words were sent with it
        self._playing, self._words_sent = item, 0
        return item


def _note(text: str) -> Item:
    return Item(id=new_id("item"), type="message", role="system", content=[{"type": "input_text", "text": text}])

