"""Run Alembic migrations from code (`rag migrate`, service start-up, tests)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from alembic import command
from alembic.config import Config
from sqlalchemy import Connection, text

from rag.db.session import Database

MIGRATIONS = Path(__file__).resolve().parents[2] / "migrations"


def _config(db: Database) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    cfg.set_main_option(
        "sqlalchemy.url", db.url.render_as_string(hide_password=False).replace("%", "%%")
    )
    return cfg


# Any constant: serialises processes that start at once (the API and N workers).
_LOCK_KEY = 727_001


def _run(db: Database, action: Callable[[Config], None]) -> None:
    cfg = _config(db)
    engine = db.engine.execution_options(sqlite_begin="IMMEDIATE")
    with engine.connect() as conn:
        if db.is_sqlite:
            # SQLite's procedure for schema changes: foreign keys off (outside a transaction,
            # where the pragma takes effect), change, check, on again. A migration that
            # rebuilds a parent table would otherwise cascade its DROP into the children.
            _sqlite_foreign_keys(conn, on=False)
        try:
            with conn.begin():
                if db.dialect == "postgresql":
                    conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _LOCK_KEY})
                cfg.attributes["connection"] = conn
                action(cfg)
                if db.is_sqlite:
                    broken = conn.exec_driver_sql("PRAGMA foreign_key_check").fetchall()
                    if broken:
                        raise RuntimeError(f"migration left {len(broken)} dangling references")
        finally:
            if db.is_sqlite:
                _sqlite_foreign_keys(conn, on=True)


def _sqlite_foreign_keys(conn: Connection, *, on: bool) -> None:
    raw = conn.connection.dbapi_connection
    assert raw is not None
    raw.execute(f"PRAGMA foreign_keys={'ON' if on else 'OFF'}")


def upgrade(db: Database, revision: str = "head") -> None:
    _run(db, lambda cfg: command.upgrade(cfg, revision))


def downgrade(db: Database, revision: str = "base") -> None:
    _run(db, lambda cfg: command.downgrade(cfg, revision))
