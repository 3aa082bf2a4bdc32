"""Speech over the assistant's reply on a WebRTC or GPT-Live session (with --resume-false-interruptions): the
reply's audio pauses within the frame, and what the user said decides. A backchannel ("mm-hm", "yeah", "right"),
a cough or nothing Whisper can read (no words, or a few it is unsure of) resumes the audio where it paused, leaves
the reply's item whole and drops the user's turn (`conversation.item.deleted`); words addressed to the assistant,
or speech that goes on past a backchannel's length, interrupt it as before (`response.done` cancelled /
turn_detected, the item cut to what was heard).

Both tests are made on the speech itself, so every turn detector decides alike: its length is its voiced audio
(the VAD's speech windows), not how long the detector keeps the turn open (semantic_vad's judges may keep it
open for seconds), and its words are the speculative transcript made at its first short silence
(TranscriptSpeculated), so the reply resumes a few hundred milliseconds after a "yeah", not once the turn has
ended and its final transcript is made. The final transcript confirms the decision when the turn ends.

Over a WebSocket the client plays the audio, and what it has been sent it has: a barge-in interrupts at once.
A pure sub-machine of the core (core.py), which passes itself in as the host."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import Protocol

from gateway.protocol import server_events as se
from gateway.realtime.commands import HoldPlayout, Output, PauseEnded
from gateway.realtime.conversation import Conversation
from gateway.realtime.turns import TurnMachine
from inference.transcript_checks import LEAST_READABLE_LOGPROB, heard_surely

# What a listener says without taking the turn. A turn of these words alone (at most three) is a backchannel, and
# hums however Whisper spells them ("Mmmmmm", "M M M M M M") do not count against the three.
BACKCHANNEL_WORDS = frozenset({
    "mm", "mmm", "mhm", "hm", "hmm", "uh", "huh", "um", "ah", "oh", "aha", "yeah", "yep", "yes", "ya", "yup",
    "right", "okay", "ok", "sure", "alright", "i", "see", "got", "it", "cool", "nice", "wow", "true", "exactly",
})
HUM = re.compile(r"[hm]*m[hm]*")
MOST_BACKCHANNEL_WORDS = 3
# Words that are for the assistant however unsure Whisper is of them: "Wait." and "No, stop." come back at -1.0 to
# -1.9 in some voices, where they would otherwise count as nothing readable and let the reply play on.
COMMAND_WORDS = frozenset({"wait", "stop", "no", "hold", "pause", "cancel", "hang"})
LONGEST_BACKCHANNEL_S = 1.2  # speech over the reply voiced for longer than this is addressed to the assistant
LONGEST_BACKCHANNEL_MS = 1000 * LONGEST_BACKCHANNEL_S
# Speech again after words judged a backchannel holds the reply once voiced this much more, as speech over a
# playing reply does the first time (--min-barge-in-speech-ms's default), and its words are judged either way: a
# short "right" after "yeah" plays on, "Okay, but what about ..." is held. benchmarks/turn_taking.py replays every
# length on its set: 0 to 480 ms moved no decision; the longest holds are long backchannels, not second words.
REHOLD_AFTER_MS = 160.0
UNDECIDED_LIMIT_S = 3.0  # a reply held this long after its turn ended, with no words to decide on, plays on


def is_backchannel(transcript: str, avg_logprob: float | None, *,
                   least_readable: float = LEAST_READABLE_LOGPROB) -> bool:
    """Whether a turn spoken over the reply lets it play on: nothing readable (no words, or a few words Whisper is
    unsure of: `avg_logprob` below `least_readable`, None when unknown), or a listener's acknowledgement ("Mm-hm.",
    "Yeah, right."); never a command ("Wait.", "No, stop."), however unsure, nor more words than a backchannel has
    however unsure (a misheard sentence: "Yeah, and can you add milk?" as "Yeah, I'm gonna have milk.")."""
    if is_command(transcript):
        return False
    words = [word for word in _words(transcript) if not HUM.fullmatch(word)]  # a hum, however long, is one word
    if len(words) > MOST_BACKCHANNEL_WORDS:
        return False
    return not heard_surely(avg_logprob, least_readable) or all(word in BACKCHANNEL_WORDS for word in words)


def is_command(transcript: str) -> bool:
    """Words for the assistant however unsure Whisper is of them ("Wait.", "No, stop.")."""
    return any(word in COMMAND_WORDS for word in _words(transcript))


def _words(transcript: str) -> list[str]:
    return re.findall(r"[a-z']+", transcript.lower().replace("-", " "))


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


class Overlap(Enum):
    NONE = "none"  # no speech over the reply (or it was decided and its turn has ended)
    HELD = "held"  # the reply's audio is held while the speech over it is decided
    PLAYING_ON = "playing_on"  # its words so far are a backchannel: the reply plays on until its turn confirms them


@dataclass
class PausedReply:
    """Speech over the reply, as a state (Overlap) and the user turns spoken over it, which end as backchannels
    (deleted) or as turns of their own. Every input names the turn it is about; one for a turn that is not the
    one deciding now changes nothing."""

    state: Overlap = Overlap.NONE
    turn: str | None = None  # the user turn whose speech holds the reply, or whose words let it play on
    since: float = 0.0  # when the state was entered (clock seconds)
    held_at: float = 0.0  # HELD: when the reply's audio was held (a hold renewed inside HELD keeps it)
    voiced_ms: float = 0.0  # that turn's voiced audio so far
    decided_at_ms: float = 0.0  # PLAYING_ON: its voiced audio when its words were judged a backchannel
    spoken_over: set[str] = field(default_factory=set)  # turns spoken over the reply whose transcripts decide them

    @property
    def open(self) -> bool:
        """Speech over the reply is being decided."""
        return self.state is not Overlap.NONE

    def speech(self, host: BargeInHost, item_id: str) -> None:
        """Speech over the reply (past the echo guard): pause it where it can resume, else interrupt."""
        if not (host.resumes_false_interruptions and host.has_playout and host.playout_busy):
            host.interrupt("turn_detected")
            return
        self.spoken_over.add(item_id)
        self.voiced_ms = 0.0
        self._hold(host, item_id)

    def voiced(self, host: BargeInHost, item_id: str, voiced_ms: float) -> None:
        """The open turn's voiced audio so far (AudioProcessed): speech longer than a backchannel interrupts at
        once; speech again after words judged a backchannel, voiced REHOLD_AFTER_MS more, holds the reply again
        until they are judged anew."""
        if item_id != self.turn or self.state is Overlap.NONE:
            return
        self.voiced_ms = voiced_ms
        if voiced_ms >= LONGEST_BACKCHANNEL_MS:
            self._interrupt(host)
        elif (self.state is Overlap.PLAYING_ON and voiced_ms > self.decided_at_ms + REHOLD_AFTER_MS
              and host.playout_busy):
            self._hold(host, item_id)  # (a reply that has played out has nothing left to hold)

    def words(self, host: BargeInHost, item_id: str, transcript: str, avg_logprob: float | None) -> None:
        """The turn's speculative transcript (all its words so far), held or playing on: a backchannel lets the
        reply play on now, anything else interrupts it now."""
        if item_id != self.turn or self.state is Overlap.NONE:
            return
        if not is_backchannel(transcript, avg_logprob):
            self._interrupt(host)
        elif self.state is Overlap.HELD:
            self._let_play(host)
        else:
            self.decided_at_ms = self.voiced_ms  # more backchannel words: speech is "again" from here

    def tick(self, host: BargeInHost) -> None:
        """No turn is open: a reply held this long with no words to decide on plays on (its turn was dropped, or
        its transcript is slow: the final one still decides it)."""
        if self.state is Overlap.HELD and host.clock() - self.since >= UNDECIDED_LIMIT_S:
            self._let_play(host)

    def turn_ready(self, host: BargeInHost, item_id: str, avg_logprob: float | None) -> bool:
        """A turn spoken over the reply has its final transcript (and Whisper's `avg_logprob` of it): True when it
        was a backchannel (its item is deleted; the reply plays on if it still has audio); otherwise the reply is
        interrupted and the turn goes on as any other."""
        if item_id not in self.spoken_over:
            return False
        self.spoken_over.discard(item_id)
        item = host.conversation.get(item_id)
        transcript = str(item.content[0].get("transcript") or "") if item.content else ""
        voiced_ms = self.voiced_ms if item_id == self.turn else 0.0
        if voiced_ms >= LONGEST_BACKCHANNEL_MS or not is_backchannel(transcript, avg_logprob):
            self._interrupt(host)
            return False
        host.conversation.delete(item_id)
        host.emit_event(se.ItemDeleted(item_id=item_id))
        if item_id == self.turn:
            self._play_on(host)
        return True

    def reset(self, host: BargeInHost) -> None:
        """The reply's audio was dropped (an interruption, a reply replacing it): a hold ends cut, and the turns
        spoken over it are turns of their own."""
        if self.state is Overlap.HELD:
            host.emit(PauseEnded("interrupted", host.clock() - self.held_at))
        self.state, self.turn = Overlap.NONE, None
        self.spoken_over.clear()

    def _hold(self, host: BargeInHost, item_id: str) -> None:
        if self.state is not Overlap.HELD:
            host.emit(HoldPlayout(True))
            self.held_at = host.clock()
        self.state, self.turn, self.since = Overlap.HELD, item_id, host.clock()

    def _resume(self, host: BargeInHost) -> None:
        """HELD -> the reply's audio plays on from where it was held."""
        host.emit(HoldPlayout(False))
        host.emit(PauseEnded("resumed", host.clock() - self.held_at))

    def _let_play(self, host: BargeInHost) -> None:
        """HELD -> PLAYING_ON: the reply's audio plays while the turn spoken over it goes on being decided."""
        self._resume(host)
        self.state, self.since, self.decided_at_ms = Overlap.PLAYING_ON, host.clock(), self.voiced_ms
        host.turns.playing_on()

    def _interrupt(self, host: BargeInHost) -> None:
        host.interrupt("turn_detected")  # the core drops the reply's audio, which resets this (reset)

    def _play_on(self, host: BargeInHost) -> None:
        """The overlap is over and was no interruption: the reply's audio plays, and new speech can pause it."""
        if self.state is Overlap.HELD:
            self._resume(host)
        self.state, self.turn = Overlap.NONE, None
        if host.playout_busy:
            host.turns.resumed()
