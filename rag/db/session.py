"""Engines and sessions. SQLite gets WAL, synchronous=FULL, secure_delete and BEGIN IMMEDIATE
for writers."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event, text
from sqlalchemy.engine import Connection, make_url
from sqlalchemy.exc import DBAPIError, OperationalError
from sqlalchemy.orm import Session, sessionmaker

log = logging.getLogger(__name__)

# How long a SQLite connection waits for a lock another holds (the purge's checkpoint waits
# for none: rag.db.purge).
BUSY_TIMEOUT_MS = 60_000


def transient(exc: BaseException) -> bool:
    """A database error that the same work may not meet again shortly: the connection was
    lost, the server is restarting, the database is locked (OperationalError), or the pool
    found its connection dead. Not the data's fault, so it never fails a document."""
    if isinstance(exc, OperationalError):
        return True
    return isinstance(exc, DBAPIError) and exc.connection_invalidated


class Database:
    """One engine per process; `read()` and `write()` open short transactions."""

    def __init__(self, url: str, *, echo: bool = False) -> None:
        self.url = make_url(url)
        self.is_sqlite = self.url.get_backend_name() == "sqlite"
        # hide_parameters: a database error's message (which gets logged with its traceback)
        # would otherwise carry the statement's parameters: chunk text, blobs, key hashes.
        kwargs: dict[str, Any] = {"echo": echo, "future": True, "hide_parameters": True}
        if self.is_sqlite:
            if self.url.database and self.url.database != ":memory:":
                Path(self.url.database).parent.mkdir(parents=True, exist_ok=True)
            kwargs["connect_args"] = {"check_same_thread": False, "timeout": BUSY_TIMEOUT_MS / 1000}
        else:
            kwargs.update(pool_pre_ping=True, pool_size=10, max_overflow=20)
            if self.url.get_backend_name() == "postgresql" and self.url.drivername == "postgresql":
                self.url = self.url.set(drivername="postgresql+psycopg")
        self.engine: Engine = create_engine(self.url, **kwargs)
        if self.is_sqlite:
            _configure_sqlite(self.engine)
        self._read = sessionmaker(self.engine, expire_on_commit=False)
        self._write = sessionmaker(
            self.engine.execution_options(sqlite_begin="IMMEDIATE"), expire_on_commit=False
        )

    def describe(self) -> str:
        """The database's URL with any password hidden (for messages)."""
        return self.url.render_as_string(hide_password=True)

    @property
    def dialect(self) -> str:
        return self.url.get_backend_name()

    @contextmanager
    def read(self) -> Iterator[Session]:
        with self._read() as session, session.begin():
            yield session

    @contextmanager
    def connect(self) -> Iterator[Connection]:
        """A read transaction on a bare connection: for hot paths that run prebuilt Core
        statements and need no ORM identity map (search's probes and hydration)."""
        with self.engine.connect() as conn:
            yield conn

    @contextmanager
    def write(self) -> Iterator[Session]:
        """A write transaction. On SQLite it takes the write lock at BEGIN, which avoids the
        deadlock of two readers both upgrading to writers."""
        with self._write() as session, session.begin():
            yield session

    def ping(self) -> None:
        """Raise if the database does not answer."""
        with self.engine.connect() as conn:
            conn.execute(text("SELECT 1"))

    def dispose(self) -> None:
        self.engine.dispose()


def _configure_sqlite(engine: Engine) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        # Let SQLAlchemy's begin event issue BEGIN itself (pysqlite's own is unreliable).
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        # Takes effect in a new database (before its first table): the purge can then give
        # free pages back without rewriting the whole file. An older database is converted
        # once by the purge (rag.db.purge.reclaim).
        cur.execute("PRAGMA auto_vacuum=INCREMENTAL")
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute("PRAGMA synchronous=FULL")
        cur.execute("PRAGMA foreign_keys=ON")
        cur.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
        # Deleted content is overwritten with zeros, not just unlinked: a purged document's
        # bytes do not linger in free pages (principle 7, "delete means gone").
        cur.execute("PRAGMA secure_delete=ON")
        cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        mode = conn.get_execution_options().get("sqlite_begin", "DEFERRED")
        conn.exec_driver_sql(f"BEGIN {mode}")
