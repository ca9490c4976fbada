"""Documents: uploaded bytes (their tenant's blob under its sha256), their metadata and
extracted text."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import PurePath
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from rag.db import collections, cursors
from rag.db.jobs import cancel_jobs_where, clock
from rag.db.models import Blob, ChangeLog, Chunk, Collection, Document, IngestJob, now
from rag.errors import NotFound


@dataclass
class Accepted:
    document: Document
    job: IngestJob | None
    duplicate: bool
    requeued: bool = False  # a failed duplicate queued again, with a new job


def _insert_blob(session: Session, tenant_id: str, sha256: str, data: bytes) -> None:
    """The tenant's copy of the bytes, unless it has them already."""
    values = {
        "tenant_id": tenant_id,
        "sha256": sha256,
        "size": len(data),
        "data": data,
        "created_at": now(),
    }
    keys = ["tenant_id", "sha256"]
    if session.get_bind().dialect.name == "postgresql":
        # DO UPDATE (not DO NOTHING) locks the row it finds: a purge deleting that blob right
        # now either commits first (and the insert happens) or waits for this upload.
        stmt = pg_insert(Blob).values(**values)
        stmt = stmt.on_conflict_do_update(index_elements=keys, set_={"size": stmt.excluded.size})
        session.execute(stmt)
    else:  # SQLite writers are serialised: nothing can delete it under us
        session.execute(sqlite_insert(Blob).values(**values).on_conflict_do_nothing(keys))


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


def add(
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
        return _requeued(session, existing, max_attempts)
    _insert_blob(session, collection.tenant_id, sha256, data)
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
        return _requeued(session, existing, max_attempts)
    return Accepted(doc, _queue(session, doc, max_attempts), duplicate=False)


def _queue(session: Session, doc: Document, max_attempts: int) -> IngestJob:
    """A new ingest job for `doc`, due now on the clock the claims read."""
    job = IngestJob(
        tenant_id=doc.tenant_id,
        collection_id=doc.collection_id,
        document_id=doc.id,
        max_attempts=max_attempts,
        run_after=clock(session),
    )
    session.add(job)
    session.flush()
    return job


def _requeued(session: Session, existing: Accepted, max_attempts: int) -> Accepted:
    """A failed document uploaded again is queued again, with a new job and its attempts:
    what failed it may be gone (a worker fault, a database outage, a fixed parser). Any
    other duplicate is returned as it is."""
    doc = existing.document
    if doc.status != "failed" or (existing.job is not None and existing.job.state != "failed"):
        return existing
    session.refresh(doc, with_for_update=True)  # one of two concurrent re-uploads queues it
    if doc.status != "failed":
        return _live_duplicate(session, doc.collection_id, doc.sha256) or existing
    t = now()
    doc.status, doc.error, doc.updated_at = "queued", None, t
    return Accepted(doc, _queue(session, doc, max_attempts), duplicate=True, requeued=True)


def list_page(
    session: Session,
    tenant_id: str,
    collection_id: str,
    *,
    limit: int,
    cursor: str | None = None,
    status: str | None = None,
) -> tuple[list[Document], str | None]:
    collections.get(session, tenant_id, collection_id)
    stmt = select(Document).where(
        Document.collection_id == collection_id,
        Document.tenant_id == tenant_id,
        Document.deleted_at.is_(None),
    )
    if status:
        stmt = stmt.where(Document.status == status)
    if cursor:
        created, doc_id = cursors.decode(cursor)
        stmt = stmt.where(
            (Document.created_at > created)
            | ((Document.created_at == created) & (Document.id > doc_id))
        )
    stmt = stmt.order_by(Document.created_at, Document.id).limit(limit + 1)
    return cursors.page(list(session.scalars(stmt)), limit, lambda d: (d.created_at, d.id))


def get(session: Session, tenant_id: str, document_id: str) -> Document:
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


def delete(session: Session, tenant_id: str, document_id: str) -> Document:
    """Tombstone now: from this commit on, no search or answer returns the document. The
    change log tells every index to drop its chunks."""
    doc = get(session, tenant_id, document_id)
    collections.lock(session, doc.collection_id)
    # Its jobs before the document, the order a worker's claim locks them in.
    cancel_jobs_where(session, IngestJob.document_id == doc.id, "document deleted")
    t = now()
    doc.deleted_at = t
    doc.status = "deleted"
    doc.updated_at = t
    chunk_ids = session.scalars(select(Chunk.id).where(Chunk.document_id == doc.id)).all()
    session.add_all(
        ChangeLog(collection_id=doc.collection_id, op="remove", chunk_id=cid, document_id=doc.id)
        for cid in chunk_ids
    )
    return doc


def corpus_names(session: Session, collection_id: str) -> dict[str, set[str]]:
    """document id -> the corpus ids it answers to in an evaluation: its metadata `_id`,
    else its filename and the filename's stem."""
    rows = session.execute(
        select(Document.id, Document.filename, Document.meta).where(
            Document.collection_id == collection_id, Document.deleted_at.is_(None)
        )
    ).all()
    out: dict[str, set[str]] = {}
    for doc_id, filename, meta in rows:
        if meta and meta.get("_id") is not None:
            out[doc_id] = {str(meta["_id"])}
        else:
            out[doc_id] = {filename, PurePath(filename).stem}
    return out


def filenames(session: Session, tenant_id: str, document_ids: list[str]) -> dict[str, str]:
    """document id -> filename, for the tenant's live documents among `document_ids`."""
    if not document_ids:
        return {}
    rows = session.execute(
        select(Document.id, Document.filename).where(
            Document.id.in_(document_ids),
            Document.tenant_id == tenant_id,
            Document.deleted_at.is_(None),
        )
    )
    return {d: f for d, f in rows}


def text_before(
    session: Session, tenant_id: str, document_id: str, position: int, size: int
) -> str:
    """Up to `size` characters of a live document's extracted text just before `position`
    ("" when there is none, or the document is not the tenant's)."""
    if position <= 0:
        return ""
    start = max(0, position - size)
    text = session.execute(
        select(func.substr(Document.text, start + 1, position - start)).where(
            Document.id == document_id,
            Document.tenant_id == tenant_id,
            Document.deleted_at.is_(None),
        )
    ).scalar_one_or_none()
    return text or ""
