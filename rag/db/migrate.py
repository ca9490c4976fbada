"""Run Alembic migrations from code (`rag migrate`, service start-up, tests)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from alembic import command
from alembic.config import Config
from sqlalchemy import text

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
    with engine.begin() as conn:
        if db.dialect == "postgresql":
            conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _LOCK_KEY})
        cfg.attributes["connection"] = conn
        action(cfg)


def upgrade(db: Database, revision: str = "head") -> None:
    _run(db, lambda cfg: command.upgrade(cfg, revision))


def downgrade(db: Database, revision: str = "base") -> None:
    _run(db, lambda cfg: command.downgrade(cfg, revision))
