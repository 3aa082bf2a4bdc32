"""The response in progress as the realtime core sees it: a sub-machine that the core routes each of the
response's inputs to, by its id.

States: IN_PROGRESS (generating: its text, audio, speech marks and function calls arrive) and CANCELLING
(StopResponse went out; what its task had under way may still arrive, until ResponseEnded, which the core
handles: the response is then no longer active). Every input below is legal in both states; a cancel of a
response already cancelling asks for nothing more.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gateway.protocol import server_events as se
from gateway.protocol.errors import ApiError
from gateway.realtime.commands import Output, Send
from gateway.realtime.conversation import Conversation, Item, SpokenSegment, new_id
from gateway.realtime.inputs import (
    AudioDelta,
    ClauseSpoken,
    FunctionCallsMade,
    IllegalInput,
    MessageOpened,
    MetadataAdded,
    ResponseFiltered,
    SpeechWritten,
    TextDelta,
    TokensReserved,
)
from gateway.realtime.response_events import Event, ResponseEvents

ResponseInput = (TokensReserved | MessageOpened | FunctionCallsMade | TextDelta | AudioDelta | SpeechWritten
                 | ClauseSpoken | MetadataAdded | ResponseFiltered)


class ResponsePhase(enum.Enum):
    IN_PROGRESS = "in_progress"
    CANCELLING = "cancelling"


def already_active(response_id: str) -> ApiError:
    """A response asked for while another is in progress (the session's conversation has one at a time)."""
    return ApiError(
        "conversation_already_has_active_response",
        f"Conversation already has an active response in progress: {response_id}. "
        "Wait until the response is finished before creating a new one.",
    )


@dataclass
class ActiveResponse:
    events: ResponseEvents
    writes_conversation: bool
    state: ResponsePhase = ResponsePhase.IN_PROGRESS
    audio_started: bool = False  # its first audio delta was sent (WebSocket): the echo guard starts there
    clause_start_ms: float = 0.0  # where the clause being spoken starts in the item's audio

    @property
    def response_id(self) -> str:
        return self.events.response_id

    @property
    def cancelling(self) -> bool:
        return self.state is ResponsePhase.CANCELLING

    def cancel(self) -> bool:
        """IN_PROGRESS -> CANCELLING; False where it was cancelling already."""
        if self.state is ResponsePhase.CANCELLING:
            return False
        self.state = ResponsePhase.CANCELLING
        return True

    def handle(self, event: ResponseInput, conversation: Conversation) -> list[Output]:
        """One of its inputs: the events to send, in order."""
        handler = _TABLE.get((self.state, type(event)))
        if handler is None:
            raise IllegalInput(f"{type(event).__name__} in response state {self.state.value}")
        return [Send(e) for e in handler(self, event, conversation)]

    def open_message(self, conversation: Conversation) -> list[Event]:
        previous = conversation.add(self.events.item) if self.writes_conversation else None
        return self.events.open_item(previous)

    # -- its inputs ---------------------------------------------------------------------------------------

    def _tokens_reserved(self, event: TokensReserved, conversation: Conversation) -> list[Event]:
        return [se.RateLimitsUpdated(rate_limits=[event.rate_limit]).wire()]

    def _message_opened(self, event: MessageOpened, conversation: Conversation) -> list[Event]:
        return self.open_message(conversation)

    def _function_calls(self, event: FunctionCallsMade, conversation: Conversation) -> list[Event]:
        out: list[Event] = []
        for call in event.calls:
            item = Item(id=new_id("item"), type="function_call", call_id=call.id, name=call.name,
                        arguments=call.arguments)
            previous = conversation.add(item) if self.writes_conversation else None
            out += self.events.function_call(item, previous)
        return out

    def _text_delta(self, event: TextDelta, conversation: Conversation) -> list[Event]:
        return self.events.text_delta(event.text)

    def _audio_delta(self, event: AudioDelta, conversation: Conversation) -> list[Event]:
        self.audio_started = True
        return self.events.audio_delta(event.audio_b64)

    def _speech_written(self, event: SpeechWritten, conversation: Conversation) -> list[Event]:
        self.events.item.audio_ms_sent += event.ms
        return []

    def _clause_spoken(self, event: ClauseSpoken, conversation: Conversation) -> list[Event]:
        item = self.events.item
        item.spoken.append(SpokenSegment(event.text, self.clause_start_ms, item.audio_ms_sent))
        self.clause_start_ms = item.audio_ms_sent
        return []

    def _metadata_added(self, event: MetadataAdded, conversation: Conversation) -> list[Event]:
        self.events.metadata = {**(self.events.metadata or {}), **event.metadata}
        return []

    def _filtered(self, event: ResponseFiltered, conversation: Conversation) -> list[Event]:
        return []  # the core clears its audio; its end follows as ResponseEnded(content_filter)


_HANDLERS: dict[type, Callable[[ActiveResponse, Any, Conversation], list[Event]]] = {
    TokensReserved: ActiveResponse._tokens_reserved,
    MessageOpened: ActiveResponse._message_opened,
    FunctionCallsMade: ActiveResponse._function_calls,
    TextDelta: ActiveResponse._text_delta,
    AudioDelta: ActiveResponse._audio_delta,
    SpeechWritten: ActiveResponse._speech_written,
    ClauseSpoken: ActiveResponse._clause_spoken,
    MetadataAdded: ActiveResponse._metadata_added,
    ResponseFiltered: ActiveResponse._filtered,
}
# (state, input) -> handler: what was under way when the cancel went out still lands, so both states take all.
_TABLE = {(state, kind): handler for state in ResponsePhase for kind, handler in _HANDLERS.items()}
