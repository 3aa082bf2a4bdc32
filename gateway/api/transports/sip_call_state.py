"""One SIP call's life as a state machine: events in, actions out, no sockets (the trunk carries the actions out).

    RINGING --accept--> ANSWERED --hang_up / caller_bye / session_ended--> ENDED
    RINGING --reject / caller_cancel / answer_timeout / hang_up--> ENDED

A ringing call's INVITE gets exactly one final response: 200 on accept, the application's code on reject, 487 when
the caller cancels (the SIP library answers that), 480 when nobody answered in time, 603 when hung up unanswered.
An answered call ends with one BYE, sent unless the caller's came first. Every other input is illegal in its state
and refused with an ApiError the route returns as it is, so a late accept never answers a call that has gone.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from gateway.protocol.errors import ApiError

UNANSWERED = 480  # Temporarily Unavailable: nobody accepted or rejected the call in time
DECLINED = 603  # OpenAI's default reject code, and a hangup before the answer


class CallState(Enum):
    RINGING = "ringing"
    ANSWERED = "answered"
    ENDED = "ended"


@dataclass(frozen=True)
class Answer:
    """Send 200 OK with the SDP answer and start the call's media and session."""


@dataclass(frozen=True)
class Decline:
    """Send this final response to the INVITE."""

    status_code: int


@dataclass(frozen=True)
class SendBye:
    """End the dialog from our side."""


@dataclass(frozen=True)
class SendRefer:
    """Ask the caller's side to transfer the call (SIP REFER)."""

    target_uri: str


@dataclass(frozen=True)
class Finish:
    """Stop the media and close the session: the call is over, for `reason`."""

    reason: str


Action = Answer | Decline | SendBye | SendRefer | Finish


class SipCallState:
    def __init__(self) -> None:
        self.state = CallState.RINGING
        self.end_reason: str | None = None

    def accept(self) -> list[Action]:
        self._require(CallState.RINGING, "accepted")
        self.state = CallState.ANSWERED
        return [Answer()]

    def reject(self, status_code: int) -> list[Action]:
        self._require(CallState.RINGING, "rejected")
        return self._end("rejected", Decline(status_code))

    def refer(self, target_uri: str) -> list[Action]:
        self._require(CallState.ANSWERED, "transferred")
        return [SendRefer(target_uri)]

    def hang_up(self) -> list[Action]:
        """The application (or the session's end) hangs up: BYE when answered, a decline while ringing."""
        if self.state is CallState.RINGING:
            return self._end("hung_up", Decline(DECLINED))
        if self.state is CallState.ANSWERED:
            return self._end("hung_up", SendBye())
        return []  # ended already: a second hangup changes nothing

    def answer_timeout(self) -> list[Action]:
        if self.state is not CallState.RINGING:
            return []  # answered or ended before the timer fired
        return self._end("answer_timeout", Decline(UNANSWERED))

    def caller_cancel(self) -> list[Action]:
        """CANCEL before the answer (the SIP library has answered it 487)."""
        if self.state is not CallState.RINGING:
            return []  # a CANCEL after the 200 does nothing (RFC 3261 9.2)
        return self._end("caller_cancelled")

    def caller_bye(self) -> list[Action]:
        if self.state is not CallState.ANSWERED:
            return []
        return self._end("caller_hung_up")

    def failed(self, reason: str) -> list[Action]:
        """The call cannot go on (its media could not be set up, its webhook never arrived)."""
        if self.state is CallState.RINGING:
            return self._end(reason, Decline(UNANSWERED))
        if self.state is CallState.ANSWERED:
            return self._end(reason, SendBye())
        return []

    def _end(self, reason: str, *first: Action) -> list[Action]:
        self.state = CallState.ENDED
        self.end_reason = reason
        return [*first, Finish(reason)]

    def _require(self, state: CallState, verb: str) -> None:
        if self.state is state:
            return
        now = "has ended" if self.state is CallState.ENDED else f"is {self.state.value}"
        raise ApiError("call_not_" + state.value, f"The call {now}: it can no longer be {verb}.", "call_id", status=409)
