"""chunk ids and change-log seqs are never handed out twice

An INTEGER PRIMARY KEY without AUTOINCREMENT lets SQLite give the highest ids out again once
the purge deleted their rows. A chunk id is the label every vector index stores and what a
"remove" entry names, so a reused id let the index purge erase a live chunk's vector; a reused
seq could fall under an index's watermark and never be applied. SQLite cannot add
AUTOINCREMENT in place: both tables are rebuilt (batch recreate), the full-text triggers on
chunks put back, and each table's counter set past every id already handed out that SQL still
knows of (a chunk id named by the change log, a seq a Milvus watermark reached).

PostgreSQL's sequences never hand a value out twice; their counters are only moved past the
same floors (rows copied in with explicit ids do not advance a sequence).

Revision ID: 0008
Revises: 0007
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_TRIGGERS = (
    "CREATE TRIGGER chunks_fts_ai AFTER INSERT ON chunks BEGIN "
    "INSERT INTO chunks_fts(rowid, text) VALUES (new.id, new.text); END",
    "CREATE TRIGGER chunks_fts_ad AFTER DELETE ON chunks BEGIN "
    "INSERT INTO chunks_fts(chunks_fts, rowid, text) VALUES ('delete', old.id, old.text); END",
)

# Each table's key, and what tells the highest value SQL knows was handed out.
_KEYS = {"chunks": "id", "change_log": "seq"}
_USED = {
    "chunks": ("SELECT max(id) FROM chunks", "SELECT max(chunk_id) FROM change_log"),
    "change_log": (
        "SELECT max(seq) FROM change_log",
        "SELECT max(watermark) FROM milvus_collections",
    ),
}


def _floor(conn: sa.Connection, table: str) -> int:
    return max(int(conn.scalar(sa.text(q)) or 0) for q in _USED[table])


def _rebuild(autoincrement: bool) -> None:
    # The triggers belong to the table that is dropped; the FTS5 table keeps its rows (rowids
    # are the chunk ids, which the copy keeps).
    op.execute("DROP TRIGGER IF EXISTS chunks_fts_ai")
    op.execute("DROP TRIGGER IF EXISTS chunks_fts_ad")
    for table in ("chunks", "change_log"):
        with op.batch_alter_table(
            table, recreate="always", table_kwargs={"sqlite_autoincrement": autoincrement}
        ):
            pass
    for trigger in _TRIGGERS:
        op.execute(trigger)


def upgrade() -> None:
    conn = op.get_bind()
    if conn.dialect.name != "sqlite":
        for table, key in _KEYS.items():
            seq = conn.scalar(sa.text(f"SELECT pg_get_serial_sequence('{table}', '{key}')"))
            conn.execute(
                sa.text(f"SELECT setval(:s, GREATEST(:f, (SELECT last_value FROM {seq})))"),
                {"s": seq, "f": _floor(conn, table)},
            )
        return
    _rebuild(autoincrement=True)
    for table in _KEYS:
        conn.execute(sa.text("DELETE FROM sqlite_sequence WHERE name = :t"), {"t": table})
        conn.execute(
            sa.text("INSERT INTO sqlite_sequence (name, seq) VALUES (:t, :f)"),
            {"t": table, "f": _floor(conn, table)},
        )


def downgrade() -> None:
    if op.get_bind().dialect.name != "sqlite":
        return
    _rebuild(autoincrement=False)
