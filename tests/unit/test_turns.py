"""The turn state machine: when to commit, respond and interrupt, and the echo guard."""

from __future__ import annotations

from gateway.realtime.turns import Action, TurnMachine, TurnPolicy, TurnState


def speaking_bot(policy: TurnPolicy | None = None, playback_at: float = 1000.0) -> TurnMachine:
    machine = TurnMachine(policy or TurnPolicy(echo_guard_ms=300))
    machine.response_started()
    machine.playback_started(playback_at)
    return machine


def test_a_turn_commits_then_responds() -> None:
    machine = TurnMachine()
    assert machine.speech_started(0) == []
    assert machine.state == TurnState.USER_SPEAKING
    assert machine.speech_stopped() == [Action.COMMIT]
    assert machine.state == TurnState.TRANSCRIBING
    assert machine.transcript_final(has_text=True) == [Action.CREATE_RESPONSE]
    machine.response_started()
    assert machine.state == TurnState.RESPONDING
    machine.playback_started(100)
    assert machine.state == TurnState.BOT_SPEAKING
    machine.reply_finished()
    assert machine.state == TurnState.LISTENING


def test_noise_with_no_words_creates_no_response() -> None:
    machine = TurnMachine()
    machine.speech_started(0)
    machine.speech_stopped()
    assert machine.transcript_final(has_text=False) == []


def test_create_response_off_means_commit_only() -> None:
    machine = TurnMachine(TurnPolicy(create_response=False))
    machine.speech_started(0)
    assert machine.speech_stopped() == [Action.COMMIT]
    assert machine.transcript_final(has_text=True) == []


def test_speech_during_a_reply_interrupts_it() -> None:
    machine = speaking_bot()
    assert machine.speech_started(2000) == [Action.INTERRUPT]
    assert machine.state == TurnState.USER_SPEAKING
    # Once interrupted, the same speech does not interrupt again.
    assert machine.tick(2100, user_speaking=True) == []


def test_speech_while_generating_before_audio_interrupts_too() -> None:
    machine = TurnMachine()
    machine.response_started()
    assert machine.speech_started(50) == [Action.INTERRUPT]


def test_interrupt_response_off_lets_the_reply_finish() -> None:
    machine = speaking_bot(TurnPolicy(interrupt_response=False))
    assert machine.speech_started(2000) == []


def test_echo_guard_defers_then_interrupts_if_speech_goes_on() -> None:
    machine = speaking_bot(playback_at=1000)
    assert machine.speech_started(1100) == []  # inside the 300 ms window: probably our own echo
    assert machine.tick(1200, user_speaking=True) == []
    assert machine.tick(1310, user_speaking=True) == [Action.INTERRUPT]


def test_echo_guard_drops_speech_that_ends_inside_the_window() -> None:
    machine = speaking_bot(playback_at=1000)
    assert machine.speech_started(1100) == []
    assert machine.tick(1200, user_speaking=False) == []
    assert machine.tick(1400, user_speaking=True) == []


def test_no_interrupt_once_the_reply_is_over() -> None:
    machine = speaking_bot()
    machine.reply_finished()
    assert machine.speech_started(5000) == []


def test_a_new_turn_during_transcription_wins() -> None:
    machine = TurnMachine()
    machine.speech_started(0)
    machine.speech_stopped()
    machine.speech_started(500)
    assert machine.transcript_final(has_text=True) == []
