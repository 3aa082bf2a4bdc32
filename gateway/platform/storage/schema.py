"""The tables. Ids are prefixed UUIDv7s: sortable by creation time, so cursor pagination is by id."""

from __future__ import annotations

import time
from typing import Any

import uuid_utils
from sqlalchemy import JSON, Float, ForeignKey, Index, Integer, LargeBinary, String, Text
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

ID_LENGTH = 40


def new_id(prefix: str) -> str:
    """`conv_` / `msg_` and a UUIDv7 in hex: later ids sort after earlier ones."""
    return f"{prefix}_{uuid_utils.uuid7().hex}"


def epoch() -> float:
    return time.time()


class Base(DeclarativeBase):
    pass


class ConversationRow(Base):
    __tablename__ = "conversations"

    id: Mapped[str] = mapped_column(String(ID_LENGTH), primary_key=True)
    owner: Mapped[str] = mapped_column(String(64))  # the API key's id (auth.Principal.key_id)
    title: Mapped[str | None] = mapped_column(String(256))
    current_leaf_id: Mapped[str | None] = mapped_column(String(ID_LENGTH))
    # The Conversations API's metadata, strings to strings (`conversation_metadata`: see MessageRow's).
    conversation_metadata: Mapped[dict[str, str] | None] = mapped_column("metadata", JSON)
    created_at: Mapped[float] = mapped_column(Float, default=epoch)
    updated_at: Mapped[float] = mapped_column(Float, default=epoch)

    __table_args__ = (Index("ix_conversations_owner_id", "owner", "id"),)


class MessageRow(Base):
    __tablename__ = "messages"

    id: Mapped[str] = mapped_column(String(ID_LENGTH), primary_key=True)
    conversation_id: Mapped[str] = mapped_column(ForeignKey("conversations.id", ondelete="CASCADE"))
    parent_id: Mapped[str | None] = mapped_column(String(ID_LENGTH))  # None: the first message of a branch root
    role: Mapped[str] = mapped_column(String(16))
    # [{"type": "text", "text": ...}, {"type": "audio_transcript", "transcript": ...}]
    content: Mapped[list[dict[str, Any]]] = mapped_column(JSON, default=list)
    tool_calls: Mapped[list[dict[str, Any]] | None] = mapped_column(JSON)
    tool_call_id: Mapped[str | None] = mapped_column(String(128))
    status: Mapped[str] = mapped_column(String(16))  # in_progress completed cancelled truncated incomplete
    model: Mapped[str | None] = mapped_column(String(128))
    input_tokens: Mapped[int | None] = mapped_column(Integer)
    cached_tokens: Mapped[int | None] = mapped_column(Integer)
    output_tokens: Mapped[int | None] = mapped_column(Integer)
    latency: Mapped[dict[str, Any] | None] = mapped_column(JSON)  # ms marks, as response.done's gateway_latency
    # Strings to strings, as OpenAI's metadata: the memories a reply used and saved (gateway/generation/memory.py). The
    # attribute is not `metadata`, which the declarative base keeps for the tables.
    message_metadata: Mapped[dict[str, str] | None] = mapped_column("metadata", JSON)
    error: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[float] = mapped_column(Float, default=epoch)
    updated_at: Mapped[float] = mapped_column(Float, default=epoch)

    __table_args__ = (Index("ix_messages_conversation_id_id", "conversation_id", "id"),)


class ResponseRow(Base):
    """A stored response of the Responses API: its object as the API returns it, and the input items it was
    given (what `previous_response_id` carries on, with the output)."""

    __tablename__ = "responses"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    owner: Mapped[str] = mapped_column(String(64))
    previous_response_id: Mapped[str | None] = mapped_column(String(64))
    conversation_id: Mapped[str | None] = mapped_column(String(ID_LENGTH))
    status: Mapped[str] = mapped_column(String(16))  # queued in_progress completed incomplete failed cancelled
    body: Mapped[dict[str, Any]] = mapped_column(JSON)
    input_items: Mapped[list[dict[str, Any]]] = mapped_column(JSON)
    created_at: Mapped[float] = mapped_column(Float, default=epoch)
    updated_at: Mapped[float] = mapped_column(Float, default=epoch)

    __table_args__ = (Index("ix_responses_owner_id", "owner", "id"),)


class ClientSecretRow(Base):
    """A minted, unspent client secret, by its SHA-256 (the secret itself is never stored)."""

    __tablename__ = "client_secrets"

    digest: Mapped[str] = mapped_column(String(64), primary_key=True)
    owner: Mapped[str] = mapped_column(String(64))
    session: Mapped[dict[str, Any]] = mapped_column(JSON)
    expires_at: Mapped[float] = mapped_column(Float)


class IdempotencyRow(Base):
    """The first answer to a POST with an Idempotency-Key."""

    __tablename__ = "idempotency_records"

    owner: Mapped[str] = mapped_column(String(64), primary_key=True)
    key: Mapped[str] = mapped_column(String(256), primary_key=True)
    fingerprint: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[float] = mapped_column(Float)
    status: Mapped[int] = mapped_column(Integer)
    media_type: Mapped[str] = mapped_column(String(128))
    body: Mapped[bytes] = mapped_column(LargeBinary)
    headers: Mapped[dict[str, str]] = mapped_column(JSON)


class RateLimitRow(Base):
    """A key's token bucket: its tokens at `updated_at` (epoch seconds)."""

    __tablename__ = "rate_limit_buckets"

    owner: Mapped[str] = mapped_column(String(64), primary_key=True)
    tokens: Mapped[float] = mapped_column(Float)
    updated_at: Mapped[float] = mapped_column(Float)


class MemoryRow(Base):
    """A fact a key's user asked to be remembered (gateway/generation/memory.py)."""

    __tablename__ = "memories"

    id: Mapped[str] = mapped_column(String(ID_LENGTH), primary_key=True)
    owner: Mapped[str] = mapped_column(String(64))
    content: Mapped[str] = mapped_column(Text)
    created_at: Mapped[float] = mapped_column(Float, default=epoch)

    __table_args__ = (Index("ix_memories_owner_id", "owner", "id"),)


class MemorySettingRow(Base):
    """A key that turned memory on (no row: off)."""

    __tablename__ = "memory_settings"

    owner: Mapped[str] = mapped_column(String(64), primary_key=True)
    enabled_at: Mapped[float] = mapped_column(Float, default=epoch)
