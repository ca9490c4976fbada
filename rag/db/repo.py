"""Tenant-scoped queries the API and the services share.

Every function takes the caller's tenant id and answers NotFound for rows of another tenant,
so a guessed id never reveals that it exists.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import Any

from sqlalchemy import func, select, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from rag.db.models import Blob, ChangeLog, Chunk, Collection, Document, IngestJob, now
from rag.errors import Conflict, Invalid, NotFound

# ---------------------------------------------------------------- collections


def create_collection(session: Session, tenant_id: str, **fields: Any) -> Collection:
    collection = Collection(tenant_id=tenant_id, **fields)
    try:
        with session.begin_nested():
            session.add(collection)
            session.flush()
    except IntegrityError:
        raise Conflict(f"a collection named {fields.get('name')!r} already exists") from None
    return collection


def list_collections(session: Session, tenant_id: str) -> list[Collection]:
    stmt = (
        select(Collection)
        .where(Collection.tenant_id == tenant_id, Collection.deleted_at.is_(None))
        .order_by(Collection.created_at, Collection.id)
    )
    return list(session.scalars(stmt))


def get_collection(
    session: Session, tenant_id: str, collection_id: str, *, lock: bool = False
) -> Collection:
    stmt = select(Collection).where(
        Collection.id == collection_id,
        Collection.tenant_id == tenant_id,
        Collection.deleted_at.is_(None),
    )
    if lock:
        # Serialises change-log writers of one collection, so seq order is commit order.
        stmt = stmt.with_for_update()
    collection = session.scalar(stmt)
    if collection is None:
        raise NotFound(f"collection {collection_id} not found")
    return collection


def lock_collection(session: Session, collection_id: str) -> Collection | None:
    stmt = select(Collection).where(Collection.id == collection_id).with_for_update()
    return session.scalar(stmt)


def delete_collection(session: Session, tenant_id: str, collection_id: str) -> None:
    collection = get_collection(session, tenant_id, collection_id, lock=True)
    t = now()
    collection.deleted_at = t
    session.execute(
        update(Document)
        .where(Document.collection_id == collection_id, Document.deleted_at.is_(None))
        .values(deleted_at=t, status="deleted", updated_at=t)
    )
    _cancel_jobs(session, IngestJob.collection_id == collection_id, "collection deleted")


def chunk_count(session: Session, collection_id: str) -> int:
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


# ---------------------------------------------------------------- documents


@dataclass
class Accepted:
    document: Document
    job: IngestJob | None
    duplicate: bool


def _insert_blob(session: Session, sha256: str, data: bytes) -> None:
    values = {"sha256": sha256, "size": len(data), "data": data, "created_at": now()}
    dialect = session.get_bind().dialect.name
    insert = pg_insert if dialect == "postgresql" else sqlite_insert
    session.execute(insert(Blob).values(**values).on_conflict_do_nothing(index_elements=["sha256"]))


def _live_duplicate(session: Session, collection_id: str, sha256: str) -> Accepted | None:
    doc = session.scalar(
        select(Document).where(
            Document.collection_id == collection_id,
            Document.sha256 == sha256,
            Document.deleted_at.is_(None),
        )
    )
    if doc is None:
        return None
    job = session.scalar(
        select(IngestJob)
        .where(IngestJob.document_id == doc.id)
        .order_by(IngestJob.created_at.desc())
        .limit(1)
    )
    return Accepted(doc, job, duplicate=True)


def add_document(
    session: Session,
    collection: Collection,
    *,
    filename: str,
    media_type: str,
    data: bytes,
    sha256: str,
    meta: dict[str, Any],
    max_attempts: int,
) -> Accepted:
    """Blob, document and ingest job in the caller's transaction: committed means durable.

    The same bytes in the same collection return the live document already there; two
    concurrent uploads of one file meet at the partial unique index and the loser returns
    the winner's document.
    """
    existing = _live_duplicate(session, collection.id, sha256)
    if existing is not None:
        return existing
    _insert_blob(session, sha256, data)
    doc = Document(
        tenant_id=collection.tenant_id,
        collection_id=collection.id,
        filename=filename,
        media_type=media_type,
        sha256=sha256,
        size=len(data),
        meta=meta,
        status="queued",
    )
    try:
        with session.begin_nested():
            session.add(doc)
            session.flush()
    except IntegrityError:
        existing = _live_duplicate(session, collection.id, sha256)
        if existing is None:  # pragma: no cover - the index said it exists
            raise
        return existing
    job = IngestJob(
        tenant_id=collection.tenant_id,
        collection_id=collection.id,
        document_id=doc.id,
        max_attempts=max_attempts,
    )
    session.add(job)
    session.flush()
    return Accepted(doc, job, duplicate=False)


def _encode_cursor(created_at: float, doc_id: str) -> str:
    return base64.urlsafe_b64encode(f"{created_at!r}|{doc_id}".encode()).decode()


def _decode_cursor(cursor: str) -> tuple[float, str]:
    try:
        raw = base64.urlsafe_b64decode(cursor.encode()).decode()
        created, doc_id = raw.split("|", 1)
        return float(created), doc_id
    except (ValueError, UnicodeDecodeError):
        raise Invalid("cursor is not one this service issued") from None


def list_documents(
    session: Session,
    tenant_id: str,
    collection_id: str,
    *,
    limit: int,
    cursor: str | None = None,
    status: str | None = None,
) -> tuple[list[Document], str | None]:
    get_collection(session, tenant_id, collection_id)
    stmt = select(Document).where(
        Document.collection_id == collection_id,
        Document.tenant_id == tenant_id,
        Document.deleted_at.is_(None),
    )
    if status:
        stmt = stmt.where(Document.status == status)
    if cursor:
        created, doc_id = _decode_cursor(cursor)
        stmt = stmt.where(
            (Document.created_at > created)
            | ((Document.created_at == created) & (Document.id > doc_id))
        )
    stmt = stmt.order_by(Document.created_at, Document.id).limit(limit + 1)
    docs = list(session.scalars(stmt))
    next_cursor = None
    if len(docs) > limit:
        docs = docs[:limit]
        next_cursor = _encode_cursor(docs[-1].created_at, docs[-1].id)
    return docs, next_cursor


def get_document(session: Session, tenant_id: str, document_id: str) -> Document:
    doc = session.scalar(
        select(Document).where(
            Document.id == document_id,
            Document.tenant_id == tenant_id,
            Document.deleted_at.is_(None),
        )
    )
    if doc is None:
        raise NotFound(f"document {document_id} not found")
    return doc


def list_chunks(
    session: Session, tenant_id: str, document_id: str, *, limit: int, offset: int
) -> list[Chunk]:
    get_document(session, tenant_id, document_id)
    stmt = (
        select(Chunk)
        .where(Chunk.document_id == document_id, Chunk.tenant_id == tenant_id)
        .order_by(Chunk.ordinal)
        .offset(offset)
        .limit(limit)
    )
    return list(session.scalars(stmt))


def delete_document(session: Session, tenant_id: str, document_id: str) -> Document:
    """Tombstone now: from this commit on, no search or answer returns the document. The
    change log tells every index to drop its chunks."""
    doc = get_document(session, tenant_id, document_id)
    lock_collection(session, doc.collection_id)
    t = now()
    doc.deleted_at = t
    doc.status = "deleted"
    doc.updated_at = t
    chunk_ids = session.scalars(select(Chunk.id).where(Chunk.document_id == doc.id)).all()
    session.add_all(
        ChangeLog(collection_id=doc.collection_id, op="remove", chunk_id=cid, document_id=doc.id)
        for cid in chunk_ids
    )
    _cancel_jobs(session, IngestJob.document_id == doc.id, "document deleted")
    return doc


def _cancel_jobs(session: Session, where: Any, reason: str) -> None:
    t = now()
    session.execute(
        update(IngestJob)
        .where(where, IngestJob.state.in_(("queued", "running")))
        .values(state="cancelled", error=reason, finished_at=t, updated_at=t, lease_owner=None)
    )


# ---------------------------------------------------------------- jobs


def get_job(session: Session, tenant_id: str, job_id: str) -> IngestJob:
    job = session.scalar(
        select(IngestJob).where(IngestJob.id == job_id, IngestJob.tenant_id == tenant_id)
    )
    if job is None:
        raise NotFound(f"job {job_id} not found")
    return job
