"""What a tenant holds and has pending, counted for its quotas and limits (rag.quota)."""

from __future__ import annotations

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from rag.db.models import Collection, Document, IngestJob, Tenant


def lock_tenant(session: Session, tenant_id: str) -> None:
    """Serialise a tenant's quota-checked writes (PostgreSQL; SQLite's writers are already
    one at a time), so two concurrent uploads cannot both fit under a quota together."""
    session.execute(select(Tenant.id).where(Tenant.id == tenant_id).with_for_update())


def collections(session: Session, tenant_id: str) -> int:
    stmt = (
        select(func.count())
        .select_from(Collection)
        .where(Collection.tenant_id == tenant_id, Collection.deleted_at.is_(None))
    )
    return int(session.scalar(stmt) or 0)


def documents(session: Session, tenant_id: str) -> tuple[int, int]:
    """The tenant's live documents: how many, and their bytes as uploaded."""
    stmt = select(func.count(), func.coalesce(func.sum(Document.size), 0)).where(
        Document.tenant_id == tenant_id, Document.deleted_at.is_(None)
    )
    count, size = session.execute(stmt).one()
    return int(count), int(size)


def pending_jobs(session: Session, tenant_id: str) -> int:
    """The tenant's ingest jobs queued or running."""
    stmt = (
        select(func.count())
        .select_from(IngestJob)
        .where(IngestJob.tenant_id == tenant_id, IngestJob.state.in_(("queued", "running")))
    )
    return int(session.scalar(stmt) or 0)
