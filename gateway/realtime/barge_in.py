"""Speech over the assistant's reply on a WebRTC session (with --resume-false-interruptions): the reply's audio
pauses within the frame, and what the user said decides. A backchannel ("mm-hm", "yeah", "right"), a cough or
nothing Whisper can read (no words, or words it is unsure of) resumes the audio where it paused, leaves the
reply's item whole and drops the user's turn (`conversation.item.deleted`); words addressed to the assistant, or
speech that goes on past a backchannel's length, interrupt it as before (`response.done` cancelled /
turn_detected, the item cut to what was heard).

Over a WebSocket the client plays the audio, and what it has been sent it has: a barge-in interrupts at once.
A pure sub-machine of the core (core.py), which passes itself in as the host."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from gateway.protocol import server_events as se
from gateway.realtime.commands import HoldPlayout, Output
from gateway.realtime.conversation import Conversation
from gateway.realtime.turns import TurnMachine

# What a listener says without taking the turn. A turn of these words alone (at most three) is a backchannel.
BACKCHANNEL_WORDS = frozenset({
    "mm", "mmm", "mhm", "hm", "hmm", "uh", "huh", "um", "ah", "oh", "aha", "yeah", "yep", "yes", "ya", "yup",
    "right", "okay", "ok", "sure", "alright", "i", "see", "got", "it", "cool", "nice", "wow", "true", "exactly",
})
MOST_BACKCHANNEL_WORDS = 3
# Whisper's average log-probability below which its words are a guess at sounds it cannot read. Measured on the
# turn-taking set (benchmarks/turn_taking.py, tiny.en): Piper's "Mm-hm." heard as "and the MHCM." -0.88 (AVX2:
# -0.93), coughs heard as "You" -1.9 to -2.1; every sentence spoken without noise, interruptions included, -0.44
# or above. Whisper's own fallback calls a decode unlikely below -1, which would keep "Mm-hm." as words. A single
# word tiny.en mishears can fall below it too ("Pause." as "boss", -1.2): only speech shorter than
# LONGEST_BACKCHANNEL_S over a paused reply is judged so.
LEAST_READABLE_LOGPROB = -0.8
LONGEST_BACKCHANNEL_S = 1.2  # speech over the reply for longer than this is addressed to the assistant
UNDECIDED_LIMIT_S = 3.0  # the user's speech never became a turn with a transcript (dropped): the reply goes on


def is_backchannel(transcript: str, avg_logprob: float | None) -> bool:
    """Whether a turn spoken over the reply lets it play on: nothing readable (no words, or words Whisper is
    unsure of: `avg_logprob`, None when unknown), or a listener's acknowledgement ("Mm-hm.", "Yeah, right.")."""
    if avg_logprob is not None and avg_logprob < LEAST_READABLE_LOGPROB:
        return True
    words = re.findall(r"[a-z']+", transcript.lower().replace("-", " "))
    return len(words) <= MOST_BACKCHANNEL_WORDS and all(word in BACKCHANNEL_WORDS for word in words)


class BargeInHost(Protocol):
    """What a paused reply needs of the core."""

    conversation: Conversation
    turns: TurnMachine
    has_playout: bool
    resumes_false_interruptions: bool

    @property
    def playout_busy(self) -> bool: ...

    @property
    def clock(self) -> Callable[[], float]: ...  # seconds, monotonic

    def emit(self, output: Output) -> None: ...

    def emit_event(self, event: se.ServerEvent) -> None: ...

    def interrupt(self, reason: str) -> None: ...


@dataclass
class PausedReply:
    """States: no pause (since is None), and paused since a moment, until a decision."""

    since: float | None = None

    def speech(self, host: BargeInHost) -> None:
        """Speech over the reply (past the echo guard): pause it where it can resume, else interrupt."""
        if not (host.resumes_false_interruptions and host.has_playout and host.playout_busy):
            host.interrupt("turn_detected")
        elif self.since is None:
            self.since = host.clock()
            host.emit(HoldPlayout(True))

    def tick(self, host: BargeInHost, *, speaking: bool) -> None:
        if self.since is None:
            return
        paused_for = host.clock() - self.since
        if speaking and paused_for >= LONGEST_BACKCHANNEL_S:
            self._interrupt(host)
        elif not speaking and paused_for >= UNDECIDED_LIMIT_S:
            self.resume(host)

    def turn_ready(self, host: BargeInHost, item_id: str, avg_logprob: float | None) -> bool:
        """The user's turn over the paused reply has its transcript (and Whisper's `avg_logprob` of it): True when
        it was a backchannel (its item is deleted; the core resumes the reply); otherwise the reply is interrupted
        and the turn goes on as any other."""
        if self.since is None:
            return False
        item = host.conversation.get(item_id)
        transcript = str(item.content[0].get("transcript") or "") if item.content else ""
        if not is_backchannel(transcript, avg_logprob):
            self._interrupt(host)
            return False
        host.conversation.delete(item_id)
        host.emit_event(se.ItemDeleted(item_id=item_id))
        return True

    def _interrupt(self, host: BargeInHost) -> None:
        self.since = None
        host.interrupt("turn_detected")  # clearing the playout ends its pause

    def resume(self, host: BargeInHost) -> None:
        self.since = None
        host.emit(HoldPlayout(False))
        host.turns.resumed()
