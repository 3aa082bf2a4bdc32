"""Turn taking as a pure state machine: inputs are what happened, outputs are what to do.

States: listening, user speaking, transcribing (the final transcript is being made), responding
(the model is generating) and bot speaking (the reply's audio is still being played or sent).
The session carries out the actions; this module has no I/O and no clock of its own.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class TurnState(Enum):
    LISTENING = "listening"
    USER_SPEAKING = "user_speaking"
    TRANSCRIBING = "transcribing"
    RESPONDING = "responding"
    BOT_SPEAKING = "bot_speaking"


class Action(Enum):
    INTERRUPT = "interrupt"  # stop the reply: clear playout, cancel generation, truncate
    COMMIT = "commit"  # turn the buffered speech into a user item (final transcript)
    CREATE_RESPONSE = "create_response"


@dataclass(frozen=True)
class TurnPolicy:
    create_response: bool = True
    interrupt_response: bool = True
    # For this long after the reply's audio starts, speech alone does not interrupt: it is most
    # likely the reply's own echo. Speech still going on when the window closes does interrupt.
    echo_guard_ms: float = 300.0


class TurnMachine:
    def __init__(self, policy: TurnPolicy | None = None) -> None:
        self.policy = policy or TurnPolicy()
        self.state = TurnState.LISTENING
        self._bot_active = False  # a reply is generating or its audio is playing
        self._playback_started_ms: float | None = None
        self._deferred_barge_in = False  # speech began inside the echo guard window

    def speech_started(self, now_ms: float) -> list[Action]:
        actions: list[Action] = []
        if self._bot_active and self.policy.interrupt_response:
            if self._in_echo_guard(now_ms):
                self._deferred_barge_in = True
            else:
                actions.append(Action.INTERRUPT)
                self._bot_active = False
        self.state = TurnState.USER_SPEAKING
        return actions

    def tick(self, now_ms: float, user_speaking: bool) -> list[Action]:
        """Called as audio is processed: a barge-in deferred by the echo guard fires once it closes."""
        if not self._deferred_barge_in:
            return []
        if not user_speaking or not self._bot_active:
            self._deferred_barge_in = False
            return []
        if self._in_echo_guard(now_ms):
            return []
        self._deferred_barge_in = False
        self._bot_active = False
        return [Action.INTERRUPT]

    def speech_stopped(self) -> list[Action]:
        self._deferred_barge_in = False
        self.state = TurnState.TRANSCRIBING
        return [Action.COMMIT]

    def transcript_final(self, has_text: bool) -> list[Action]:
        """The committed turn's transcript is known; empty speech (noise) creates no response."""
        if self.state == TurnState.USER_SPEAKING:
            return []  # the user already started another turn
        self.state = TurnState.LISTENING
        return [Action.CREATE_RESPONSE] if has_text and self.policy.create_response else []

    def response_started(self) -> None:
        self._bot_active = True
        self._playback_started_ms = None
        if self.state != TurnState.USER_SPEAKING:
            self.state = TurnState.RESPONDING

    def playback_started(self, now_ms: float) -> None:
        self._playback_started_ms = now_ms
        if self.state == TurnState.RESPONDING:
            self.state = TurnState.BOT_SPEAKING

    def reply_finished(self) -> None:
        """Generation is over and its audio, if any, has played out (or was cut)."""
        self._bot_active = False
        self._deferred_barge_in = False
        self._playback_started_ms = None
        if self.state in (TurnState.RESPONDING, TurnState.BOT_SPEAKING):
            self.state = TurnState.LISTENING

    def playing_on(self) -> None:
        """The reply paused by the user's speech plays on while their turn is still open (its words so far are a
        backchannel): more speech over it can pause it again."""
        self._bot_active = True

    def resumed(self) -> None:
        """The speech that paused the reply was not addressed to it (a backchannel): it plays on, and can be
        interrupted again."""
        self._bot_active = True
        self.state = TurnState.BOT_SPEAKING

    def _in_echo_guard(self, now_ms: float) -> bool:
        started = self._playback_started_ms
        return started is not None and now_ms - started < self.policy.echo_guard_ms
