"""answers, feedback and drift: quality you can watch

Answers as they were given (question, answer, passages, settings, how they ended), the
documents each retrieved (so deleting one erases them), feedback per answer and key, and the
drift windows and state of each collection.

Revision ID: 0011
Revises: 0010
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "answers",
        sa.Column("id", sa.String(40), primary_key=True),
        sa.Column("tenant_id", sa.String(32), nullable=False),
        sa.Column("collection_id", sa.String(32), nullable=False),
        sa.Column("conversation_id", sa.String(32), nullable=True),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("question", sa.Text(), nullable=True),
        sa.Column("question_embedding", sa.LargeBinary(), nullable=True),
        sa.Column("answer", sa.Text(), nullable=False),
        sa.Column("chunk_ids", sa.JSON(), nullable=False),
        sa.Column("settings", sa.JSON(), nullable=False),
        sa.Column("answer_source", sa.String(20), nullable=False),
        sa.Column("finish_reason", sa.String(20), nullable=False),
        sa.Column("mode", sa.String(20), nullable=False),
        sa.Column("top_score", sa.Float(), nullable=True),
        sa.Column("score_gap", sa.Float(), nullable=True),
        sa.Column("unsupported", sa.Integer(), nullable=False),
        sa.Column("first_token_ms", sa.Float(), nullable=True),
        sa.Column("latency_ms", sa.Float(), nullable=False),
        sa.Column("weak", sa.Boolean(), nullable=False),
    )
    op.create_index("ix_answers_collection_created", "answers", ["collection_id", "created_at"])
    op.create_index("ix_answers_created", "answers", ["created_at"])
    op.create_index("ix_answers_conversation", "answers", ["conversation_id"])
    op.create_table(
        "answer_documents",
        sa.Column(
            "answer_id",
            sa.String(40),
            sa.ForeignKey("answers.id", ondelete="CASCADE"),
            primary_key=True,
        ),
        sa.Column("document_id", sa.String(32), primary_key=True),
    )
    op.create_index("ix_answer_documents_document", "answer_documents", ["document_id"])
    op.create_table(
        "feedback",
        sa.Column(
            "answer_id",
            sa.String(40),
            sa.ForeignKey("answers.id", ondelete="CASCADE"),
            primary_key=True,
        ),
        sa.Column("key_id", sa.String(32), primary_key=True),
        sa.Column("tenant_id", sa.String(32), nullable=False),
        sa.Column("collection_id", sa.String(32), nullable=False),
        sa.Column("rating", sa.String(4), nullable=False),
        sa.Column("comment", sa.Text(), nullable=True),
        sa.Column("correct_answer", sa.Text(), nullable=True),
        sa.Column("correct_document_id", sa.String(32), nullable=True),
        sa.Column("created_at", sa.Float(), nullable=False),
    )
    op.create_index("ix_feedback_collection_created", "feedback", ["collection_id", "created_at"])
    op.create_table(
        "drift_windows",
        sa.Column("collection_id", sa.String(32), primary_key=True),
        sa.Column("answer_id", sa.String(40), primary_key=True),
        sa.Column("embedding", sa.LargeBinary(), nullable=False),
        sa.Column("top_score", sa.Float(), nullable=True),
        sa.Column("refused", sa.Boolean(), nullable=False),
        sa.Column("asked_at", sa.Float(), nullable=False),
    )
    op.create_table(
        "drift_state",
        sa.Column("collection_id", sa.String(32), primary_key=True),
        sa.Column("kind", sa.String(10), primary_key=True),
        sa.Column("tenant_id", sa.String(32), nullable=False),
        sa.Column("score", sa.Float(), nullable=False),
        sa.Column("statistic", sa.Float(), nullable=False),
        sa.Column("threshold", sa.Float(), nullable=False),
        sa.Column("alert", sa.Boolean(), nullable=False),
        sa.Column("streak", sa.Integer(), nullable=False),
        sa.Column("mark", sa.BigInteger(), nullable=False),
        sa.Column("pinned", sa.Boolean(), nullable=False),
        sa.Column("details", sa.JSON(), nullable=False),
        sa.Column("updated_at", sa.Float(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("drift_state")
    op.drop_table("drift_windows")
    op.drop_index("ix_feedback_collection_created", table_name="feedback")
    op.drop_table("feedback")
    op.drop_index("ix_answer_documents_document", table_name="answer_documents")
    op.drop_table("answer_documents")
    op.drop_index("ix_answers_conversation", table_name="answers")
    op.drop_index("ix_answers_created", table_name="answers")
    op.drop_index("ix_answers_collection_created", table_name="answers")
    op.drop_table("answers")
