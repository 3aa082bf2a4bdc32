"""LiveDelegations' bookkeeping: what the live model's delegate call and the client's updates do, without a backend."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gateway.protocol.errors import ApiError
from gateway.protocol.live_events import (
    ClientDelegation,
    LiveSessionConfig,
    ResponsesDelegation,
    ResponsesDelegationUpdate,
)
from gateway.realtime.live_delegation import MAX_PENDING_ITEMS, LiveDelegations, check_backend
from gateway.realtime.live_wire import LiveTranslator
from tests.integration.sdk_types import assert_valid_live_event


def delegations(config: ClientDelegation | ResponsesDelegation) -> tuple[LiveDelegations, list[Any]]:
    said: list[Any] = []
    driver = LiveDelegations(config, prepare=None, say=said.append, speak=said.append,
                             acknowledge=lambda text: said.append(("ack", text)), report=said.append,
                             clock_ms=lambda: 1234)
    return driver, said


async def test_a_client_delegation_is_announced_then_acknowledged_after_its_delay() -> None:
    driver, said = delegations(ClientDelegation(type="client", acknowledgement_delay_ms=50))
    driver.delegated("Book a table for two.")
    [created] = said
    assert_valid_live_event({"event_id": "event_1", **created})
    assert created["delegation"]["target"] == "client" and created["offset_ms"] == 1234
    assert "response_id" not in created["delegation"]
    assert driver.knows(created["delegation"]["id"]) and not driver.knows("deleg_other")
    await asyncio.sleep(0.1)
    assert said[-1][0] == "ack"


async def test_appended_commentary_cancels_a_pending_acknowledgement() -> None:
    driver, said = delegations(ClientDelegation(type="client", acknowledgement_delay_ms=50))
    driver.delegated("Book a table for two.")
    driver.cancel_acks()
    await asyncio.sleep(0.1)
    assert len(said) == 1  # the announcement only
    await driver.close()


def test_the_delegation_type_cannot_change_and_responses_settings_merge() -> None:
    driver, _ = delegations(ResponsesDelegation(type="responses", responses={"model": "m", "instructions": "A."}))
    with pytest.raises(ApiError) as refused:
        driver.update(ClientDelegation(type="client"))
    assert refused.value.param == "session.delegation.type"
    driver.update(ResponsesDelegationUpdate(type="responses", responses={"tool_choice": "none"}))
    assert isinstance(driver.config, ResponsesDelegation)
    assert driver.config.responses == {"model": "m", "instructions": "A.", "tool_choice": "none"}


def test_client_requests_need_a_responses_delegation() -> None:
    driver, _ = delegations(ClientDelegation(type="client"))
    for request in (driver.create, lambda: driver.item_create({"type": "message"})):
        with pytest.raises(ApiError) as refused:
            request()
        assert refused.value.code == "invalid_value"


@pytest.mark.parametrize(("responses", "param"), [
    ({"model": "m", "stream": False}, "session.delegation.responses.stream"),
    ({"model": "m", "tools": [{"type": "web_search"}]}, "session.delegation.responses.tools[0]"),
    ({"model": "m", "temperature": 9}, "session.delegation.responses.temperature"),
    ({"instructions": "x"}, "session.delegation.responses.model"),
])
def test_backend_settings_are_checked_as_the_request_they_become(responses: dict[str, Any], param: str) -> None:
    with pytest.raises(ApiError) as refused:
        check_backend(responses)
    assert refused.value.param is not None and refused.value.param.startswith(param), refused.value


def test_the_live_models_function_calls_reach_the_front() -> None:
    translate = LiveTranslator(LiveSessionConfig(model="gpt-live-1"), "gpt-live-1", lambda: 0)
    calls: list[tuple[str, str, str]] = []
    translate.on_call = lambda *call: calls.append(call)
    translate({"type": "response.done", "response": {"output": [
        {"type": "message", "content": []},
        {"type": "function_call", "name": "delegate", "call_id": "call_1", "arguments": '{"task": "x"}'}]}})
    assert calls == [("delegate", "call_1", '{"task": "x"}')]


def test_items_waiting_for_response_create_are_bounded() -> None:
    driver, _ = delegations(ResponsesDelegation(type="responses", responses={"model": "m"}))
    for _ in range(MAX_PENDING_ITEMS):
        driver.item_create({"type": "message", "role": "user", "content": "x"})
    with pytest.raises(ApiError) as refused:
        driver.item_create({"type": "message", "role": "user", "content": "x"})
    assert refused.value.param == "item"
    with pytest.raises(ApiError) as untyped:
        driver.item_create({"role": "user"})
    assert untyped.value.param == "item.type"
