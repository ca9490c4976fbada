"""Migrations upgrade from empty and downgrade cleanly, on SQLite and PostgreSQL."""

from __future__ import annotations

from sqlalchemy import inspect

from rag.db import Database
from rag.db.migrate import downgrade, upgrade
from rag.db.models import Base

TABLES = {
    "tenants",
    "api_keys",
    "collections",
    "blobs",
    "documents",
    "chunks",
    "ingest_jobs",
    "change_log",
}


def test_upgrade_from_empty_matches_the_models_and_downgrades_cleanly(db_url: str) -> None:
    db = Database(db_url)
    try:
        upgrade(db)
        insp = inspect(db.engine)
        assert set(insp.get_table_names()) >= TABLES
        for table in Base.metadata.sorted_tables:
            live = {c["name"] for c in insp.get_columns(table.name)}
            assert live == {c.name for c in table.columns}, table.name
        downgrade(db)
        left = set(inspect(db.engine).get_table_names()) - {"alembic_version"}
        assert not any(t.startswith("chunks_fts") for t in left)
        assert left == set()
        upgrade(db)  # and up again
        assert set(inspect(db.engine).get_table_names()) >= TABLES
    finally:
        db.dispose()


def test_models_and_migrations_agree(db_url: str) -> None:
    """Autogenerate finds nothing to do: no model change lacks its migration."""
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext

    db = Database(db_url)
    try:
        upgrade(db)
        with db.engine.connect() as conn:
            # Full-text structures are dialect-specific and live outside the models.
            ctx = MigrationContext.configure(
                conn,
                opts={
                    "include_name": lambda name, kind, _: (
                        not (name or "").startswith(("chunks_fts", "ix_chunks_fts"))
                    )
                },
            )
            diff = compare_metadata(ctx, Base.metadata)
        assert diff == []
    finally:
        db.dispose()
