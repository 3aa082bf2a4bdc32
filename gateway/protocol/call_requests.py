"""The bodies of a SIP call's `reject` and `refer`: Realtime's (`client.realtime.calls.reject/refer`) and GPT-Live's
(`client.live.sessions.reject/refer`, whose reject names its code)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class RejectCall(BaseModel):
    model_config = ConfigDict(extra="forbid")

    status_code: int = Field(603, ge=300, le=699, description="The SIP final response sent to the caller "
                             "(default 603 Decline).")


class LiveRejectCall(BaseModel):
    model_config = ConfigDict(extra="forbid")

    status_code: int = Field(ge=300, le=699, description="The SIP final response sent to the caller (required).")


class ReferCall(BaseModel):
    model_config = ConfigDict(extra="forbid")

    target_uri: str = Field(max_length=512, pattern=r"^(tel:\+?[0-9*#().\-]{1,64}|sips?:[^\s<>\"]{1,500})$",
                            description="Where the call is transferred: a tel: number or a sip: URI (SIP REFER).")
