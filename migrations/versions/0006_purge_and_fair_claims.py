"""indexes for the purge and for claims that are fair across tenants

The purge finds a deleted document's change-log entries by document; a claim takes each
tenant's oldest due jobs in turn, and an upload counts its tenant's pending jobs. The
composite index on ingest jobs starts with the tenant, so it also serves what the index on
the tenant alone did, which goes.

Revision ID: 0006
Revises: 0005
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_index("ix_change_log_document", "change_log", ["document_id"])
    op.create_index(
        "ix_ingest_jobs_tenant_claim", "ingest_jobs", ["tenant_id", "state", "run_after"]
    )
    op.drop_index("ix_ingest_jobs_tenant_id", table_name="ingest_jobs")


def downgrade() -> None:
    op.create_index("ix_ingest_jobs_tenant_id", "ingest_jobs", ["tenant_id"])
    op.drop_index("ix_ingest_jobs_tenant_claim", table_name="ingest_jobs")
    op.drop_index("ix_change_log_document", table_name="change_log")
