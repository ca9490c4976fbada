"""Collections: a tenant's named sets of documents, each with its own index and defaults.

Tenant-scoped lookups answer NotFound for another tenant's rows, so a guessed id never
reveals that it exists.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection, bindparam, func, or_, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from rag.db.jobs import cancel_jobs_where
from rag.db.locks import lock_collection
from rag.db.models import Collection, Document, IngestJob, Tenant, now
from rag.errors import Conflict, Invalid, NotFound


def create(session: Session, tenant_id: str, **fields: Any) -> Collection:
    collection = Collection(tenant_id=tenant_id, **fields)
    try:
        with session.begin_nested():
            session.add(collection)
            session.flush()
    except IntegrityError:
        raise Conflict(f"a collection named {fields.get('name')!r} already exists") from None
    return collection


def list_live(session: Session, tenant_id: str) -> list[Collection]:
    stmt = (
        select(Collection)
        .where(Collection.tenant_id == tenant_id, Collection.deleted_at.is_(None))
        .order_by(Collection.created_at, Collection.id)
    )
    return list(session.scalars(stmt))


def get(
    session: Session, tenant_id: str, collection_id: str, *, lock: bool = False,
    share: bool = False,
) -> Collection:  # fmt: skip
    """A live collection of the tenant, or NotFound. `lock`: its row locked for update (a
    delete, a change of its settings); `share`: locked against those only (an upload), so
    the tombstone is read under the lock a delete takes and stays as read until commit."""
    stmt = select(Collection).where(
        Collection.id == collection_id,
        Collection.tenant_id == tenant_id,
        Collection.deleted_at.is_(None),
    )
    if lock:
        # Serialises change-log writers of one collection, so seq order is commit order.
        stmt = stmt.with_for_update()
    elif share:  # FOR KEY SHARE: uploads never wait for each other or for ingest's writes
        stmt = stmt.with_for_update(read=True, key_share=True)
    collection = session.scalar(stmt)
    if collection is None:
        raise NotFound(f"collection {collection_id} not found")
    return collection


def get_live(session: Session, collection_id: str) -> Collection | None:
    """A live collection by id, whatever its tenant (operator commands, the indexes)."""
    collection = session.get(Collection, collection_id)
    if collection is None or collection.deleted_at is not None:
        return None
    return collection


def live_among(session: Session, collection_ids: list[str]) -> set[str]:
    """The ids among `collection_ids` that name a live collection (the others are deleted or
    gone: their indexes and snapshots go too)."""
    if not collection_ids:
        return set()
    stmt = select(Collection.id).where(
        Collection.id.in_(collection_ids), Collection.deleted_at.is_(None)
    )
    return set(session.scalars(stmt))


def all_live(session: Session) -> list[str]:
    """Every live collection's id, of every tenant (an operator's commands)."""
    stmt = select(Collection.id).where(Collection.deleted_at.is_(None)).order_by(Collection.id)
    return list(session.scalars(stmt))


lock = lock_collection


def find(session: Session, ref: str, *, tenant_id: str | None = None) -> Collection | None:
    """The live collection `ref` names: its id, else its name. Names are unique within a
    tenant; without `tenant_id` (an operator's command) a name two tenants use is Invalid."""
    stmt = select(Collection).where(
        Collection.deleted_at.is_(None), or_(Collection.id == ref, Collection.name == ref)
    )
    if tenant_id is not None:
        stmt = stmt.where(Collection.tenant_id == tenant_id)
    rows = list(session.scalars(stmt.order_by(Collection.created_at, Collection.id)))
    by_id = [c for c in rows if c.id == ref]
    if by_id:  # an id wins over a name (a collection may be named like another's id)
        return by_id[0]
    if len(rows) > 1:
        raise Invalid(
            f"{len(rows)} tenants have a collection named {ref!r}: use its id or name the tenant"
        )
    return rows[0] if rows else None


def find_in_tenant_named(session: Session, ref: str, tenant_name: str) -> Collection | None:
    """`find` within the tenant called `tenant_name` (operator commands take names)."""
    tenant_id = session.scalar(select(Tenant.id).where(Tenant.name == tenant_name))
    if tenant_id is None:
        return None
    return find(session, ref, tenant_id=tenant_id)


def delete(session: Session, tenant_id: str, collection_id: str) -> None:
    """Cancel the collection's pending jobs; tombstone it and its documents. The row lock
    orders it with uploads (which take it shared): an upload that got it first commits
    before this tombstones its document, one that comes after finds the collection gone."""
    collection = get(session, tenant_id, collection_id, lock=True)
    # Jobs before documents, the order a worker's claim locks them in (rag.db.jobs), so the
    # two cannot deadlock.
    cancel_jobs_where(session, IngestJob.collection_id == collection_id, "collection deleted")
    t = now()
    collection.deleted_at = t
    session.execute(
        update(Document)
        .where(Document.collection_id == collection_id, Document.deleted_at.is_(None))
        .values(deleted_at=t, status="deleted", updated_at=t)
    )


def chunk_count(session: Session, collection_id: str) -> int:
    """Chunks of the collection's live, indexed documents."""
    stmt = select(func.coalesce(func.sum(Document.chunk_count), 0)).where(
        Document.collection_id == collection_id,
        Document.deleted_at.is_(None),
        Document.status == "indexed",
    )
    return int(session.scalar(stmt) or 0)


def document_counts(session: Session, collection_id: str) -> dict[str, int]:
    stmt = (
        select(Document.status, func.count())
        .where(Document.collection_id == collection_id, Document.deleted_at.is_(None))
        .group_by(Document.status)
    )
    return {status: int(n) for status, n in session.execute(stmt)}


def indexed_chunks_by_collection(session: Session) -> dict[str, int]:
    stmt = (
        select(Document.collection_id, func.coalesce(func.sum(Document.chunk_count), 0))
        .where(Document.deleted_at.is_(None), Document.status == "indexed")
        .group_by(Document.collection_id)
    )
    return {cid: int(n) for cid, n in session.execute(stmt)}


# Built once: every search runs it, and building a statement costs more than running it on
# SQLite.
_SAVED_DEFAULTS = select(Collection.search_defaults).where(
    Collection.id == bindparam("cid"),
    Collection.tenant_id == bindparam("tenant"),
    Collection.deleted_at.is_(None),
)


def saved_defaults(conn: Connection, tenant_id: str, collection_id: str) -> dict[str, Any] | None:
    """The collection's saved search defaults ({} when none), or None when the tenant has no
    such live collection. On a bare connection: this runs before every search."""
    row = conn.execute(_SAVED_DEFAULTS, {"cid": collection_id, "tenant": tenant_id}).first()
    if row is None:
        return None
    return dict(row[0] or {})


def set_search_defaults(session: Session, collection: Collection, defaults: dict[str, Any]) -> None:
    collection.search_defaults = dict(defaults)


def set_index_spec(
    session: Session, collection: Collection, kind: str, params: dict[str, Any]
) -> None:
    collection.index_kind, collection.index_params = kind, dict(params)


def set_tuning(
    session: Session, collection_id: str, tuning: dict[str, Any], defaults: dict[str, Any] | None
) -> None:
    """Store `rag tune`'s measurements and, when given, new search defaults."""
    row = session.get(Collection, collection_id)
    if row is None:
        raise NotFound(f"collection {collection_id} not found")
    if defaults is not None:
        row.search_defaults = dict(defaults)
    row.tuning = tuning
