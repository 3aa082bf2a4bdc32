"""Client secrets, idempotency records and rate-limit buckets, so that they survive a restart.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-24
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "client_secrets",
        sa.Column("digest", sa.String(64), primary_key=True),
        sa.Column("owner", sa.String(64), nullable=False),
        sa.Column("session", sa.JSON, nullable=False),
        sa.Column("expires_at", sa.Float, nullable=False),
    )
    op.create_table(
        "idempotency_records",
        sa.Column("owner", sa.String(64), primary_key=True),
        sa.Column("key", sa.String(256), primary_key=True),
        sa.Column("fingerprint", sa.String(64), nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("status", sa.Integer, nullable=False),
        sa.Column("media_type", sa.String(128), nullable=False),
        sa.Column("body", sa.LargeBinary, nullable=False),
        sa.Column("headers", sa.JSON, nullable=False),
    )
    op.create_table(
        "rate_limit_buckets",
        sa.Column("owner", sa.String(64), primary_key=True),
        sa.Column("tokens", sa.Float, nullable=False),
        sa.Column("updated_at", sa.Float, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("rate_limit_buckets")
    op.drop_table("idempotency_records")
    op.drop_table("client_secrets")
