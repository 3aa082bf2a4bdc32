"""GPT-Live's delegation: the voice keeps the conversation going while a task runs elsewhere.

The live model is given one tool, `delegate(task)`. When it calls it, the task goes where the session said:
- `client`: to the application, as `session.delegation.created`; it answers with instructions, thinking or
  commentary tied to the delegation's id (live_front.py);
- `responses`: to the gateway's own Responses service (gateway/generation/response_run.py, the same engine or
  `--llm-backend`), run with the session's backend `model`, `instructions`, `tools` and `tool_choice`. Its
  streaming events reach the client wrapped in `response.event`; a function call there is the client's to run
  (`response.item.create` with its output, then `response.create`, continue the task: the next request chains on
  the last with previous_response_id). The voice says a short acknowledgement after `acknowledgement_delay_ms`
  (so there is no dead air), then the result, in its own words.
The client may also start a Responses task itself: `response.item.create` then `response.create`.

One task runs at a time; it is owned here, cancelled and awaited when the session ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Literal

from gateway.generation.response_run import ResponseRun
from gateway.protocol.errors import ApiError
from gateway.protocol.live_events import ClientDelegation, ResponsesDelegation, ResponsesDelegationUpdate
from gateway.protocol.response_objects import wire
from gateway.protocol.responses import ResponseCreateRequest, parse_response_request
from gateway.realtime.conversation import new_id
from gateway.realtime.response_events import Event

log = logging.getLogger(__name__)

DELEGATE = "delegate"
DELEGATE_TOOL = {
    "type": "function",
    "name": DELEGATE,
    "description": "Hand the user's request to the backend when it needs tools, lookups, actions or careful work. "
                   "Keep talking with the user meanwhile; the result comes back to you to tell them.",
    "parameters": {"type": "object", "properties": {"task": {"type": "string", "description": "What to do, in full."}},
                   "required": ["task"]},
}
ACKNOWLEDGE = "Tell the user in a few words that you are working on it."
# The Responses request fields a session's backend settings may not set: the delegation sets them.
DELEGATION_SETS = ("input", "previous_response_id", "conversation", "stream", "store", "background")
LIFECYCLE = ("response.created", "response.in_progress", "response.completed", "response.incomplete",
             "response.failed")

MAX_PENDING_ITEMS = 128  # items created for the next request, before its response.create

PrepareRun = Callable[[ResponseCreateRequest], Awaitable[ResponseRun]]


@dataclass
class Delegation:
    id: str
    target: Literal["client", "responses"]
    response_id: str | None = None
    waits_for_client: bool = False  # its last response ended with function calls for the client to run


def check_backend(responses: dict[str, Any], param: str = "session.delegation.responses") -> None:
    """The session's backend settings, checked as the Responses request they become (errors name them)."""
    for name in DELEGATION_SETS:
        if name in responses:
            raise ApiError("invalid_value", f"'{name}' is set by the delegation, not by its settings.",
                           f"{param}.{name}")
    try:
        parse_response_request({**responses, "input": "(the task)"})
    except ApiError as error:
        error.param = f"{param}.{error.param}" if error.param else param
        raise


class LiveDelegations:
    def __init__(self, config: ClientDelegation | ResponsesDelegation, *, prepare: PrepareRun | None,
                 say: Callable[[Event], None], speak: Callable[[str], None], acknowledge: Callable[[str], None],
                 report: Callable[[ApiError], None], clock_ms: Callable[[], int]) -> None:
        self.config = config
        self._prepare = prepare  # the Responses service (responses delegation)
        self._say = say  # a Live event to the client
        self._speak = speak  # a note the voice says in its own words, when it is free
        self._acknowledge = acknowledge  # a short acknowledgement, if the voice is free now
        self._report = report  # an error event
        self._clock_ms = clock_ms
        self._client_ids: set[str] = set()
        self._pending: list[dict[str, Any]] = []  # input items for the next request
        self._last_response_id: str | None = None
        self._current: Delegation | None = None
        self._task: asyncio.Task[None] | None = None
        self._ack: asyncio.TimerHandle | None = None

    @property
    def kind(self) -> Literal["client", "responses"]:
        return self.config.type

    def knows(self, delegation_id: str) -> bool:
        """A client delegation's id (what instructions, thinking and commentary may be tied to)."""
        return delegation_id in self._client_ids

    # -- what the live model and the client ask -----------------------------------------------------------------

    def delegated(self, task: str) -> None:
        """The live model called delegate(task)."""
        if isinstance(self.config, ClientDelegation):
            delegation = Delegation(new_id("deleg"), "client")
            self._client_ids.add(delegation.id)
            self._announce(delegation)
            self._schedule_ack()
            return
        self._pending.append({"type": "message", "role": "user", "content": task})
        self._start()

    def item_create(self, item: dict[str, Any]) -> None:
        self._responses_only("response.item.create")
        if not isinstance(item.get("type"), str):
            raise ApiError("missing_required_parameter", "Missing required parameter: 'item.type'.", "item.type")
        if len(self._pending) >= MAX_PENDING_ITEMS:
            raise ApiError("invalid_value", f"At most {MAX_PENDING_ITEMS} items wait for response.create.", "item")
        self._pending.append(item)

    def create(self) -> None:
        self._responses_only("response.create")
        self._start()

    def update(self, update: ClientDelegation | ResponsesDelegationUpdate) -> None:
        if update.type != self.config.type:
            raise ApiError("invalid_value", f"This session delegates to '{self.config.type}'; the delegation's type "
                           "cannot change.", "session.delegation.type")
        if isinstance(update, ClientDelegation):
            self.config = update if update.acknowledgement_delay_ms is not None else self.config
            return
        assert isinstance(self.config, ResponsesDelegation)
        responses = {**self.config.responses, **(update.responses or {})}
        check_backend(responses)
        delay = update.acknowledgement_delay_ms
        self.config = ResponsesDelegation(type="responses", responses=responses, acknowledgement_delay_ms=(
            delay if delay is not None else self.config.acknowledgement_delay_ms))

    def cancel_acks(self) -> None:
        """Commentary or thinking was appended: it says more than an acknowledgement would."""
        if self._ack is not None:
            self._ack.cancel()
            self._ack = None

    async def close(self) -> None:
        self.cancel_acks()
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    # -- a Responses task --------------------------------------------------------------------------------------

    def _responses_only(self, kind: str) -> None:
        if not isinstance(self.config, ResponsesDelegation):
            raise ApiError("invalid_value", f"{kind} needs a Responses delegation (session.delegation type "
                           "'responses').", "type")

    def _start(self) -> None:
        if self._task is not None and not self._task.done():
            raise ApiError("delegation_in_progress", "A delegated response is in progress; wait for its end.", "type")
        assert isinstance(self.config, ResponsesDelegation)
        request = parse_response_request({
            **self.config.responses, "input": self._pending, "stream": True, "store": True,
            **({"previous_response_id": self._last_response_id} if self._last_response_id else {})})
        self._pending = []
        current = self._current
        delegation = current if current is not None and current.waits_for_client else Delegation(
            new_id("deleg"), "responses")
        self._current = delegation
        self._task = asyncio.create_task(self._run(delegation, request), name=f"delegation {delegation.id}")

    async def _run(self, delegation: Delegation, request: ResponseCreateRequest) -> None:
        assert self._prepare is not None
        try:
            run = await self._prepare(request)
        except ApiError as error:
            self._report(error)
            return
        fresh = delegation.response_id is None
        delegation.response_id = run.state.id
        self._last_response_id = run.state.id
        if fresh:
            self._announce(delegation)
            self._schedule_ack()
        calls, text = False, ""
        try:
            async for event in run.events():
                data = wire(event)
                if data["type"] in LIFECYCLE:
                    output = data["response"].get("output") or []
                    calls = any(item.get("type") == "function_call" for item in output)
                    text = " ".join(part.get("text", "") for item in output if item.get("type") == "message"
                                    for part in item.get("content") or [])
                    # Lifecycle snapshots stay small, as OpenAI's: the granular events carry the content.
                    data["response"].update(instructions=None, tools=[], output=[])
                self._say({"type": "response.event", "event": data, "delegation_id": delegation.id})
        except asyncio.CancelledError:
            run.cancel()
            raise
        except Exception:  # a defect of ours mid-stream: the client is told, the session goes on
            log.exception("delegation %s failed", delegation.id)
            self._report(ApiError("server_error", "The delegated response failed.", type="server_error", status=500))
            return
        delegation.waits_for_client = calls
        if text.strip():
            self.cancel_acks()
            self._speak(f"The result of the user's request, to tell them in your own words: {text.strip()}")

    def _announce(self, delegation: Delegation) -> None:
        body: dict[str, Any] = {"id": delegation.id, "target": delegation.target, "type": "delegation"}
        if delegation.response_id is not None:
            body["response_id"] = delegation.response_id
        self._say({"type": "session.delegation.created", "delegation": body, "offset_ms": self._clock_ms()})

    def _schedule_ack(self) -> None:
        self.cancel_acks()
        delay = self.config.acknowledgement_delay_ms or 0
        loop = asyncio.get_running_loop()
        self._ack = loop.call_later(delay / 1000, self._acknowledge_now)

    def _acknowledge_now(self) -> None:
        self._ack = None
        with contextlib.suppress(ApiError):  # a reply already under way says enough
            self._acknowledge(ACKNOWLEDGE)
