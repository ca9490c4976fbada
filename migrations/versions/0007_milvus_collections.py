"""which Milvus collection serves a collection of kind "milvus", and its watermark

Milvus holds a derived copy of a collection's vectors, shared by every replica. The row
names the Milvus collection searches use (a rebuild fills a new one and swaps the name here),
the parameters it was built with, the change-log watermark it reflects, and a build under
way (so that replicas wait for one build instead of each starting their own). No foreign
key: the row outlives a purged collection until its Milvus collection is dropped.

Revision ID: 0007
Revises: 0006
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "milvus_collections",
        sa.Column("collection_id", sa.String(32), primary_key=True),
        sa.Column("name", sa.String(255), nullable=True),
        sa.Column("params", sa.JSON(), nullable=False),
        sa.Column("watermark", sa.BigInteger(), nullable=False, server_default="0"),
        sa.Column("building", sa.String(255), nullable=True),
        sa.Column("build_started_at", sa.Float(), nullable=True),
        sa.Column("updated_at", sa.Float(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("milvus_collections")
