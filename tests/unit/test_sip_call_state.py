"""The SIP call's state machine: each input's actions in each state, and the inputs it refuses."""

from __future__ import annotations

import pytest

from gateway.api.transports.sip_call_state import (
    DECLINED,
    UNANSWERED,
    Answer,
    CallState,
    Decline,
    Finish,
    SendBye,
    SendRefer,
    SipCallState,
)
from gateway.protocol.errors import ApiError


def answered() -> SipCallState:
    machine = SipCallState()
    assert machine.accept() == [Answer()]
    return machine


def test_a_ringing_call_is_answered_then_transferred_and_hung_up_with_one_bye() -> None:
    machine = answered()
    assert machine.state is CallState.ANSWERED
    assert machine.refer("tel:+14155550123") == [SendRefer("tel:+14155550123")]
    assert machine.hang_up() == [SendBye(), Finish("hung_up")]
    assert machine.hang_up() == [] and machine.caller_bye() == []  # one BYE, whatever comes after
    assert machine.end_reason == "hung_up"


@pytest.mark.parametrize(("end", "actions", "reason"), [
    (lambda m: m.reject(486), [Decline(486), Finish("rejected")], "rejected"),
    (lambda m: m.answer_timeout(), [Decline(UNANSWERED), Finish("answer_timeout")], "answer_timeout"),
    (lambda m: m.caller_cancel(), [Finish("caller_cancelled")], "caller_cancelled"),  # aiosipua sent the 487
    (lambda m: m.hang_up(), [Decline(DECLINED), Finish("hung_up")], "hung_up"),
    (lambda m: m.failed("webhook_undelivered"), [Decline(UNANSWERED), Finish("webhook_undelivered")],
     "webhook_undelivered"),
])
def test_a_ringing_call_gets_exactly_one_final_response(end, actions, reason) -> None:  # type: ignore[no-untyped-def]
    machine = SipCallState()
    assert end(machine) == actions
    assert machine.state is CallState.ENDED and machine.end_reason == reason
    with pytest.raises(ApiError) as late:
        machine.accept()  # a late accept never answers a call that has gone
    assert late.value.status == 409 and "ended" in late.value.message
    assert machine.answer_timeout() == [] and machine.caller_cancel() == []


def test_the_caller_hanging_up_ends_an_answered_call_without_a_bye_of_ours() -> None:
    machine = answered()
    assert machine.caller_bye() == [Finish("caller_hung_up")]
    assert machine.hang_up() == []


def test_inputs_that_do_not_fit_the_state_are_refused_or_ignored() -> None:
    ringing = SipCallState()
    with pytest.raises(ApiError) as early:
        ringing.refer("sip:agent@example.com")  # nothing to transfer before the answer
    assert early.value.code == "call_not_answered" and early.value.status == 409
    assert ringing.caller_bye() == []  # a BYE needs a dialog
    machine = answered()
    with pytest.raises(ApiError):
        machine.accept()
    with pytest.raises(ApiError):
        machine.reject(603)
    assert machine.answer_timeout() == [] and machine.caller_cancel() == []  # CANCEL after the 200 does nothing
    assert machine.failed("media") == [SendBye(), Finish("media")]
