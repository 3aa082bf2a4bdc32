"""Durable state: conversations as trees of messages (SQLite by default, PostgreSQL by URL)."""
