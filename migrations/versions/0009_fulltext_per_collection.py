"""one FTS5 table a collection (SQLite): keyword scores that are the collection's own

bm25() takes its statistics from the whole FTS5 table: with one table for every tenant's
chunks, a tenant's scores moved when another tenant ingested a word, and each query read
every tenant's postings. Each collection's chunks move to `chunks_fts_<collection id>`
(contentless; written by rag.db.fulltext with the chunks, emptied by the purge), and the
shared table and its triggers go. PostgreSQL is unchanged: ts_rank_cd reads only the
passage's own words.

Revision ID: 0008_fts_per_collection
Revises: 0007
"""

import re
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_ID = re.compile(r"[0-9A-Za-z]{1,64}")


def upgrade() -> None:
    bind = op.get_bind()
    if bind.dialect.name != "sqlite":
        return
    op.execute("DROP TRIGGER IF EXISTS chunks_fts_ad")
    op.execute("DROP TRIGGER IF EXISTS chunks_fts_ai")
    op.execute("DROP TABLE IF EXISTS chunks_fts")
    owners = bind.execute(sa.text("SELECT DISTINCT collection_id FROM chunks")).scalars()
    for collection_id in list(owners):
        if not _ID.fullmatch(collection_id):
            raise RuntimeError("a collection id that is not alphanumeric")
        table = f"chunks_fts_{collection_id}"
        op.execute(
            f"CREATE VIRTUAL TABLE {table} USING fts5("
            "text, content='', tokenize='porter unicode61')"
        )
        bind.execute(
            sa.text(
                f"INSERT INTO {table}(rowid, text) "
                "SELECT id, text FROM chunks WHERE collection_id = :cid"
            ),
            {"cid": collection_id},
        )


def downgrade() -> None:
    bind = op.get_bind()
    if bind.dialect.name != "sqlite":
        return
    names = bind.execute(
        sa.text(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND sql LIKE 'CREATE VIRTUAL%'"
        )
    ).scalars()
    for name in list(names):
        if name.startswith("chunks_fts_") and _ID.fullmatch(name[len("chunks_fts_") :]):
            op.execute(f"DROP TABLE {name}")
    op.execute(
        "CREATE VIRTUAL TABLE chunks_fts USING fts5("
        "text, content='chunks', content_rowid='id', tokenize='porter unicode61')"
    )
    op.execute(
        "CREATE TRIGGER chunks_fts_ai AFTER INSERT ON chunks BEGIN "
        "INSERT INTO chunks_fts(rowid, text) VALUES (new.id, new.text); END"
    )
    op.execute(
        "CREATE TRIGGER chunks_fts_ad AFTER DELETE ON chunks BEGIN "
        "INSERT INTO chunks_fts(chunks_fts, rowid, text) "
        "VALUES ('delete', old.id, old.text); END"
    )
    op.execute("INSERT INTO chunks_fts(chunks_fts) VALUES ('rebuild')")
