"""The migrations build what the models declare: a column added to schema.py without its migration (or the
reverse) fails here, not on a user's database."""

from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.config import Config
from alembic.migration import MigrationContext
from sqlalchemy import create_engine

from gateway.platform.storage.database import MIGRATIONS
from gateway.platform.storage.schema import Base


def test_the_migrations_at_head_match_the_models() -> None:
    engine = create_engine("sqlite://")
    with engine.begin() as connection:
        config = Config()
        config.set_main_option("script_location", str(MIGRATIONS))
        config.attributes["connection"] = connection
        command.upgrade(config, "head")
        assert compare_metadata(MigrationContext.configure(connection), Base.metadata) == []
