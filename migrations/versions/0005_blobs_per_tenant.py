"""blobs are stored per tenant

A blob was keyed by its sha256 alone and shared by every tenant that uploaded the same bytes:
one tenant's delete could not erase them while another still held them, and an upload's
timing told a tenant whether some bytes already existed elsewhere. Now a blob is keyed by
(tenant, sha256), and a document points at its own tenant's copy. Existing blobs are copied
once per tenant whose documents use them; blobs no document uses are dropped.

SQLite cannot change a table's keys in place, so `blobs` and `documents` are rebuilt (the
runner turns SQLite's foreign keys off around a migration, as SQLite's own procedure for
schema changes says: dropping a parent table would otherwise cascade into its children).

Revision ID: 0005
Revises: 0004
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_DOCUMENT_COLUMNS = (
    "id, tenant_id, collection_id, filename, media_type, sha256, size, status, error, "
    "metadata, text, chunk_count, created_at, updated_at, indexed_at, deleted_at"
)


def _blob_columns(per_tenant: bool) -> list[sa.Column]:  # type: ignore[type-arg]
    tenant = [sa.Column("tenant_id", sa.String(length=32), nullable=False)] if per_tenant else []
    return [
        *tenant,
        sa.Column("sha256", sa.String(length=64), nullable=False),
        sa.Column("size", sa.BigInteger(), nullable=False),
        sa.Column("data", sa.LargeBinary(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
    ]


def _create_blobs(name: str, per_tenant: bool) -> None:
    if per_tenant:
        keys: list[sa.schema.Constraint] = [
            sa.ForeignKeyConstraint(["tenant_id"], ["tenants.id"], ondelete="CASCADE"),
            sa.PrimaryKeyConstraint("tenant_id", "sha256"),
        ]
    else:
        keys = [sa.PrimaryKeyConstraint("sha256")]
    op.create_table(name, *_blob_columns(per_tenant), *keys)


def _rebuild_documents_sqlite(blob_key: sa.ForeignKeyConstraint) -> None:
    """documents, rebuilt with another foreign key to blobs (SQLite's 12-step procedure)."""
    op.create_table(
        "_documents_new",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("tenant_id", sa.String(length=32), nullable=False),
        sa.Column("collection_id", sa.String(length=32), nullable=False),
        sa.Column("filename", sa.String(length=255), nullable=False),
        sa.Column("media_type", sa.String(length=100), nullable=False),
        sa.Column("sha256", sa.String(length=64), nullable=False),
        sa.Column("size", sa.BigInteger(), nullable=False),
        sa.Column("status", sa.String(length=20), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("metadata", sa.JSON(), nullable=False),
        sa.Column("text", sa.Text(), nullable=True),
        sa.Column("chunk_count", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("updated_at", sa.Float(), nullable=False),
        sa.Column("indexed_at", sa.Float(), nullable=True),
        sa.Column("deleted_at", sa.Float(), nullable=True),
        sa.ForeignKeyConstraint(["collection_id"], ["collections.id"], ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["tenant_id"], ["tenants.id"], ondelete="CASCADE"),
        blob_key,
        sa.PrimaryKeyConstraint("id"),
    )
    op.execute(
        f"INSERT INTO _documents_new ({_DOCUMENT_COLUMNS}) "
        f"SELECT {_DOCUMENT_COLUMNS} FROM documents"
    )
    op.drop_table("documents")
    op.rename_table("_documents_new", "documents")
    op.create_index(
        "ix_documents_collection_created", "documents", ["collection_id", "created_at", "id"]
    )
    op.create_index("ix_documents_tenant_id", "documents", ["tenant_id"])
    op.create_index(
        "uq_documents_collection_sha_live",
        "documents",
        ["collection_id", "sha256"],
        unique=True,
        sqlite_where=sa.text("deleted_at IS NULL"),
    )
    op.create_index(
        "ix_documents_collection_counts",
        "documents",
        ["collection_id", "deleted_at", "status", "chunk_count"],
    )


def upgrade() -> None:
    sqlite = op.get_bind().dialect.name == "sqlite"
    if not sqlite:
        op.drop_constraint("documents_sha256_fkey", "documents", type_="foreignkey")
    _create_blobs("_blobs_new", per_tenant=True)
    op.execute(
        "INSERT INTO _blobs_new (tenant_id, sha256, size, data, created_at) "
        "SELECT u.tenant_id, b.sha256, b.size, b.data, b.created_at FROM blobs b "
        "JOIN (SELECT DISTINCT tenant_id, sha256 FROM documents) u ON u.sha256 = b.sha256"
    )
    op.drop_table("blobs")
    op.rename_table("_blobs_new", "blobs")
    blob_key = sa.ForeignKeyConstraint(
        ["tenant_id", "sha256"], ["blobs.tenant_id", "blobs.sha256"], name="fk_documents_blob"
    )
    if sqlite:
        _rebuild_documents_sqlite(blob_key)
    else:
        op.execute("ALTER TABLE blobs RENAME CONSTRAINT _blobs_new_pkey TO blobs_pkey")
        op.execute(
            "ALTER TABLE blobs RENAME CONSTRAINT _blobs_new_tenant_id_fkey TO blobs_tenant_id_fkey"
        )
        op.create_foreign_key(
            "fk_documents_blob",
            "documents",
            "blobs",
            ["tenant_id", "sha256"],
            ["tenant_id", "sha256"],
        )


def downgrade() -> None:
    sqlite = op.get_bind().dialect.name == "sqlite"
    if not sqlite:
        op.drop_constraint("fk_documents_blob", "documents", type_="foreignkey")
    _create_blobs("_blobs_old", per_tenant=False)
    # One copy of each content hash (the copies are the same bytes).
    op.execute(
        "INSERT INTO _blobs_old (sha256, size, data, created_at) "
        "SELECT b.sha256, b.size, b.data, b.created_at FROM blobs b "
        "WHERE b.tenant_id = (SELECT MIN(c.tenant_id) FROM blobs c WHERE c.sha256 = b.sha256)"
    )
    op.drop_table("blobs")
    op.rename_table("_blobs_old", "blobs")
    blob_key = sa.ForeignKeyConstraint(["sha256"], ["blobs.sha256"])
    if sqlite:
        _rebuild_documents_sqlite(blob_key)
    else:
        op.execute("ALTER TABLE blobs RENAME CONSTRAINT _blobs_old_pkey TO blobs_pkey")
        op.create_foreign_key("documents_sha256_fkey", "documents", "blobs", ["sha256"], ["sha256"])
