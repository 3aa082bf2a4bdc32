"""The policy on what the model is about to read: chat messages, transcripts (Realtime items: realtime/conversation.py).

A block rule's match refuses the message (400 `content_policy_violation`, or an `error` event); a redact
rule's match is replaced, and the model (and whatever stores the message) sees the redacted text only.
"""

from __future__ import annotations

from dataclasses import replace

from gateway.platform import metrics
from gateway.protocol.errors import ApiError
from gateway.safety.policy import SafetyPolicy
from inference.llm.chat import ChatMessage

SCREENED_ROLES = ("user", "tool")  # what the user typed or said, and what tools returned


def violation(rule: str, what: str, param: str | None) -> ApiError:
    metrics.SAFETY_FINDINGS.labels("input", rule, "block").inc()
    return ApiError("content_policy_violation", f"The {what} was refused by the content policy (rule: {rule}).", param)


def screen_text(policy: SafetyPolicy, text: str, *, what: str, param: str | None) -> str:
    """`text` as the model may read it; ApiError when a block rule matches."""
    if not policy or not text:
        return text
    screened = policy.screen(text)
    if (blocked := screened.blocked) is not None:
        raise violation(blocked.rule, what, param)
    for finding in screened.findings:
        metrics.SAFETY_FINDINGS.labels("input", finding.rule, "redact").inc()
    return screened.text


def screen_messages(policy: SafetyPolicy, messages: list[ChatMessage], param: str = "messages") -> list[ChatMessage]:
    """The user and tool messages screened (the others as they are); their index names the refused one."""
    if not policy:
        return messages
    return [replace(message, content=screen_text(policy, message.content, what=f"{message.role} message",
                                                  param=f"{param}[{index}].content"))
            if message.role in SCREENED_ROLES else message
            for index, message in enumerate(messages)]
