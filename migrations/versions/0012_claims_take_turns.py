"""an index on ingest jobs by tenant and last change: claims take turns across tenants

A claim starts with the tenant served least recently (the latest change to one of its jobs
that are not queued), so each claim looks up each waiting tenant's latest job.

Revision ID: 0012
Revises: 0011
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_index("ix_ingest_jobs_tenant_updated", "ingest_jobs", ["tenant_id", "updated_at"])


def downgrade() -> None:
    op.drop_index("ix_ingest_jobs_tenant_updated", table_name="ingest_jobs")
