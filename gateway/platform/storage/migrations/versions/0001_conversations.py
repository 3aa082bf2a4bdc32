"""Conversations and their messages (a tree: each message names its parent).

Revision ID: 0001
Revises:
Create Date: 2026-11-24
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "conversations",
        sa.Column("id", sa.String(40), primary_key=True),
        sa.Column("owner", sa.String(64), nullable=False),
        sa.Column("title", sa.String(256)),
        sa.Column("current_leaf_id", sa.String(40)),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("updated_at", sa.Float, nullable=False),
    )
    op.create_index("ix_conversations_owner_id", "conversations", ["owner", "id"])
    op.create_table(
        "messages",
        sa.Column("id", sa.String(40), primary_key=True),
        sa.Column("conversation_id", sa.String(40), sa.ForeignKey("conversations.id", ondelete="CASCADE"),
                  nullable=False),
        sa.Column("parent_id", sa.String(40)),
        sa.Column("role", sa.String(16), nullable=False),
        sa.Column("content", sa.JSON, nullable=False),
        sa.Column("tool_calls", sa.JSON),
        sa.Column("tool_call_id", sa.String(128)),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("model", sa.String(128)),
        sa.Column("input_tokens", sa.Integer),
        sa.Column("cached_tokens", sa.Integer),
        sa.Column("output_tokens", sa.Integer),
        sa.Column("latency", sa.JSON),
        sa.Column("error", sa.Text),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("updated_at", sa.Float, nullable=False),
    )
    op.create_index("ix_messages_conversation_id_id", "messages", ["conversation_id", "id"])


def downgrade() -> None:
    op.drop_table("messages")
    op.drop_table("conversations")
