"""WebRTC's outbound audio as the realtime core sees it: which reply is queued or playing (the turn machine
counts the assistant as speaking until it has played out), and a finished reply cut by a barge-in, waiting
for the playout buffer to say how much of it was heard. A WebSocket session has no playout: the client plays
the audio, and says what it heard with conversation.item.truncate."""

from __future__ import annotations

from dataclasses import dataclass

from gateway.protocol import server_events as se
from gateway.realtime.commands import ClearPlayout, Output, Send, SetProducing
from gateway.realtime.conversation import Item
from gateway.realtime.inputs import PlayoutCleared, PlayoutStarted, PlayoutStopped

PlayoutInput = PlayoutStarted | PlayoutStopped | PlayoutCleared


@dataclass
class PlayoutView:
    _speaking: tuple[Item, str] | None = None  # the reply whose audio is queued or playing, and its response
    _unheard: Item | None = None  # a finished reply cut by ClearPlayout, waiting for what was heard of it

    @property
    def busy(self) -> bool:
        return self._speaking is not None

    @property
    def response_id(self) -> str | None:
        """The response whose audio is playing."""
        return self._speaking[1] if self._speaking is not None else None

    def speak(self, item: Item, response_id: str) -> list[Output]:
        """A reply with audio started: it writes audio until it ends (SetProducing(False), from the core)."""
        self._speaking = (item, response_id)
        return [SetProducing(True)]

    def silent(self, item: Item) -> None:
        """The reply `item` ended without writing audio (it called functions, or failed first): the playout has
        nothing of it to play, so no PlayoutStopped comes, and the assistant is not speaking."""
        if self._speaking is not None and self._speaking[0] is item:
            self._speaking = None

    def clear(self, generating: Item | None) -> list[Output]:
        """Barge-in or a new reply: drop the queued audio. ``generating``: the item of the response still in
        progress (it is trimmed when it ends); a reply that had finished generating is cut to what was heard."""
        speaking, self._speaking = self._speaking, None
        if speaking is None:
            return [ClearPlayout(None)]
        item, response_id = speaking
        finished = generating is not item
        self._unheard = item if finished else None
        return [Send(se.OutputCleared(response_id=response_id).wire()), ClearPlayout(item.id if finished else None)]

    def handle(self, event: PlayoutInput, out: list[Output]) -> bool:
        """One of the playout's marks, its events appended to ``out``; True where the reply playing played out."""
        match event:
            case PlayoutStarted():
                out.append(Send(se.OutputStarted(response_id=self.response_id).wire()))
            case PlayoutCleared():
                out.extend(self._cleared(event))
            case PlayoutStopped():
                stopped = self._stopped(event)
                if stopped is not None:
                    out.extend(stopped)
                    return True
        return False

    def _cleared(self, event: PlayoutCleared) -> list[Output]:
        """What was heard of the finished reply that ClearPlayout cut: its item keeps that much."""
        item, self._unheard = self._unheard, None
        if item is None or item.id != event.item_id:
            return []
        heard = item.cut_audio(event.played_ms)
        if item.content:
            item.content[0]["transcript"] = heard
        item.status = "incomplete"
        return [Send(se.ItemTruncated(item_id=item.id, content_index=0, audio_end_ms=round(item.audio_ms_sent)).wire())]

    def _stopped(self, event: PlayoutStopped) -> list[Output] | None:
        """The reply playing has played out: the events to send, or None where ``event`` is about another."""
        if self._speaking is None or self._speaking[0].id != event.item_id:
            return None
        response_id = self._speaking[1]
        self._speaking = None
        return [Send(se.OutputStopped(response_id=response_id).wire())]
