"""Memories: facts each key's user asked to be remembered, and the keys that turned memory on.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-25
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "memories",
        sa.Column("id", sa.String(40), primary_key=True),
        sa.Column("owner", sa.String(64), nullable=False),
        sa.Column("content", sa.Text, nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
    )
    op.create_index("ix_memories_owner_id", "memories", ["owner", "id"])
    op.create_table(
        "memory_settings",
        sa.Column("owner", sa.String(64), primary_key=True),
        sa.Column("enabled_at", sa.Float, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("memory_settings")
    op.drop_index("ix_memories_owner_id", table_name="memories")
    op.drop_table("memories")
