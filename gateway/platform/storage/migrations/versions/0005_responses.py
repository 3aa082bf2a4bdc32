"""The public APIs' tables: conversations get metadata (the Conversations API's, strings to strings), and
stored responses (the Responses API's `store`, `previous_response_id` and `GET /v1/responses/{id}`).

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-26
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("conversations") as batch:
        batch.add_column(sa.Column("metadata", sa.JSON(), nullable=True))
    op.create_table(
        "responses",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("owner", sa.String(64), nullable=False),
        sa.Column("previous_response_id", sa.String(64), nullable=True),
        sa.Column("conversation_id", sa.String(40), nullable=True),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("body", sa.JSON(), nullable=False),
        sa.Column("input_items", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("updated_at", sa.Float, nullable=False),
    )
    op.create_index("ix_responses_owner_id", "responses", ["owner", "id"])


def downgrade() -> None:
    op.drop_index("ix_responses_owner_id", table_name="responses")
    op.drop_table("responses")
    with op.batch_alter_table("conversations") as batch:
        batch.drop_column("metadata")
