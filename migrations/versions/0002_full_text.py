"""full-text search over chunks, and a place for tuning results

SQLite: an FTS5 table over chunks.text kept in step by triggers (BM25 ranking built in).
PostgreSQL: a GIN index over to_tsvector('english', text).
Both live in the same transactions as the chunks, so the keyword side of hybrid search is
never behind the record.

Revision ID: 0002
Revises: 0001
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("collections") as batch:
        batch.add_column(sa.Column("tuning", sa.JSON(), nullable=True))
    if op.get_bind().dialect.name == "sqlite":
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
    else:
        op.execute("CREATE INDEX ix_chunks_fts ON chunks USING gin (to_tsvector('english', text))")


def downgrade() -> None:
    if op.get_bind().dialect.name == "sqlite":
        op.execute("DROP TRIGGER IF EXISTS chunks_fts_ad")
        op.execute("DROP TRIGGER IF EXISTS chunks_fts_ai")
        op.execute("DROP TABLE IF EXISTS chunks_fts")
    else:
        op.execute("DROP INDEX IF EXISTS ix_chunks_fts")
    with op.batch_alter_table("collections") as batch:
        batch.drop_column("tuning")
