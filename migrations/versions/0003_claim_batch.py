"""ingest jobs remember how many jobs their lease was claimed with

A worker that dies while holding a batch of jobs says nothing about which job killed it, so
the attempt is not charged to any of them; each is retried on its own instead. Only a worker
that dies holding one job charges that job an attempt.

Revision ID: 0003
Revises: 0002
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("ingest_jobs") as batch:
        batch.add_column(
            sa.Column("claimed_with", sa.Integer(), nullable=False, server_default="1")
        )


def downgrade() -> None:
    with op.batch_alter_table("ingest_jobs") as batch:
        batch.drop_column("claimed_with")
