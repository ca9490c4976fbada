"""conversations: stored turns over a collection, erased like everything else

Three tables: `conversations` (one per conversation, owned by the key that created it),
`conversation_turns` (question, answer, the query searched, citations) and
`conversation_sources` (the documents a turn's passages came from, so the purge of a document
finds the turns to erase). Self-contained: it depends on no other migration's objects but
the tenants and collections tables.

Revision ID: 0010
Revises: 0009
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_BIG_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "conversations",
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column(
            "tenant_id",
            sa.String(32),
            sa.ForeignKey("tenants.id", ondelete="CASCADE"),
            nullable=False,
        ),  # fmt: skip
        sa.Column(
            "collection_id",
            sa.String(32),
            sa.ForeignKey("collections.id", ondelete="CASCADE"),
            nullable=False,
        ),  # fmt: skip
        sa.Column("key_id", sa.String(32), nullable=False),
        sa.Column("turn_count", sa.Integer, nullable=False),
        sa.Column("erased_turns", sa.Integer, nullable=False),
        sa.Column("bytes", sa.BigInteger, nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("updated_at", sa.Float, nullable=False),
        sa.Column("deleted_at", sa.Float, nullable=True),
    )
    op.create_index(
        "ix_conversations_collection_updated", "conversations",
        ["collection_id", "updated_at", "id"],
    )  # fmt: skip
    op.create_index("ix_conversations_tenant", "conversations", ["tenant_id", "deleted_at"])
    op.create_table(
        "conversation_turns",
        sa.Column("id", _BIG_ID, primary_key=True, autoincrement=True),
        sa.Column(
            "conversation_id",
            sa.String(32),
            sa.ForeignKey("conversations.id", ondelete="CASCADE"),
            nullable=False,
        ),  # fmt: skip
        sa.Column("ordinal", sa.Integer, nullable=False),
        sa.Column("question", sa.Text, nullable=False),
        sa.Column("searched_query", sa.Text, nullable=False),
        sa.Column("answer", sa.Text, nullable=False),
        sa.Column("answer_source", sa.String(20), nullable=False),
        sa.Column("finish_reason", sa.String(20), nullable=False),
        sa.Column("citations", sa.JSON, nullable=False),
        sa.Column("bytes", sa.BigInteger, nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
        sqlite_autoincrement=True,
    )
    op.create_index(
        "ix_conversation_turns_conversation", "conversation_turns", ["conversation_id", "ordinal"]
    )
    op.create_table(
        "conversation_sources",
        sa.Column(
            "turn_id",
            _BIG_ID,
            sa.ForeignKey("conversation_turns.id", ondelete="CASCADE"),
            primary_key=True,
        ),  # fmt: skip
        sa.Column("document_id", sa.String(32), primary_key=True),
    )
    op.create_index("ix_conversation_sources_document", "conversation_sources", ["document_id"])


def downgrade() -> None:
    op.drop_table("conversation_sources")
    op.drop_table("conversation_turns")
    op.drop_table("conversations")
