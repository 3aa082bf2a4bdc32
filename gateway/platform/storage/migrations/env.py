"""Alembic's environment: the gateway runs the migrations itself at start, on its own connection
(gateway/platform/storage/database.py), so there is no alembic.ini and no URL here."""

from __future__ import annotations

from alembic import context

from gateway.platform.storage.schema import Base

connection = context.config.attributes["connection"]
context.configure(connection=connection, target_metadata=Base.metadata, render_as_batch=True)
with context.begin_transaction():
    context.run_migrations()
