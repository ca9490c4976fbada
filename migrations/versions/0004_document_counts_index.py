"""A covering index for a collection's counts.

`GET /v1/collections/{id}` sums the chunk counts of a collection's live, indexed documents;
the column sits after the document's text, so without an index SQLite read every document row
through its text (17 ms for 200 documents of 500 chunks). The index answers from itself.

Revision ID: 0004
Revises: 0003
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_index(
        "ix_documents_collection_counts",
        "documents",
        ["collection_id", "deleted_at", "status", "chunk_count"],
    )


def downgrade() -> None:
    op.drop_index("ix_documents_collection_counts", table_name="documents")
