"""The ingest queue in SQL: claim with a lease, renew, finish, retry.

PostgreSQL claims with `FOR UPDATE SKIP LOCKED`, so many workers never take one job twice;
SQLite claims inside `BEGIN IMMEDIATE`, which serialises claimers. Every state change after a
claim checks that the lease is still ours: a worker whose lease expired (and whose job another
worker took over) cannot write anything.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
from sqlalchemy import ColumnElement, and_, func, select, update
from sqlalchemy.orm import Session

from rag.db import vectors as vector_codec
from rag.db.locks import lock_collection
from rag.db.models import Blob, ChangeLog, Chunk, Collection, Document, IngestJob, now
from rag.db.session import Database
from rag.errors import NotFound

log = logging.getLogger(__name__)


class LeaseLost(Exception):
    """Another worker owns the job now; drop this attempt without writing."""


@dataclass(frozen=True)
class ClaimedJob:
    id: str
    document_id: str
    collection_id: str
    attempt: int
    max_attempts: int
    owner: str


@dataclass(frozen=True)
class JobInput:
    data: bytes
    media_type: str
    embedding_model: str
    embedding_dim: int
    chunk_tokens: int
    chunk_overlap: int


@dataclass(frozen=True)
class ChunkRow:
    ordinal: int
    text: str
    start_char: int
    end_char: int
    token_count: int


def claim(db: Database, owner: str, lease_s: float) -> ClaimedJob | None:
    """Take the oldest runnable job: queued and due, or running with an expired lease."""
    claimed = claim_many(db, owner, lease_s, 1)
    return claimed[0] if claimed else None


def claim_many(db: Database, owner: str, lease_s: float, limit: int) -> list[ClaimedJob]:
    """Take up to `limit` runnable jobs in one transaction (one commit, not one per job),
    marking their documents `parsing`.

    A job whose worker died (its lease expired) comes first and comes alone. If that worker
    held a batch, nobody knows which job killed it, so the attempt is charged to none of them;
    each is retried on its own, and only a worker that dies holding one job charges it. A
    document that crashes workers thus ends `failed` after `max_attempts` solo tries, and its
    batch-mates are never failed with it."""
    t = now()
    with db.write() as session:
        recovered = _take_over(session, owner, lease_s, t, skip_locked=not db.is_sqlite)
        if recovered is not None:
            taken = [recovered]
        else:
            stmt = (
                select(IngestJob)
                .where(IngestJob.state == "queued", IngestJob.run_after <= t)
                .order_by(IngestJob.run_after, IngestJob.id)
                .limit(limit)
            )
            if not db.is_sqlite:
                stmt = stmt.with_for_update(skip_locked=True)
            taken = list(session.scalars(stmt).all())
            for job in taken:
                job.attempts += 1
                _lease(job, owner, lease_s, t, len(taken))
        if taken:
            session.execute(
                update(Document)
                .where(
                    Document.id.in_([job.document_id for job in taken]),
                    Document.deleted_at.is_(None),
                )
                .values(status="parsing", updated_at=t)
            )
        return [
            ClaimedJob(j.id, j.document_id, j.collection_id, j.attempts, j.max_attempts, owner)
            for j in taken
        ]


def _take_over(
    session: Session, owner: str, lease_s: float, t: float, *, skip_locked: bool
) -> IngestJob | None:
    """The oldest job whose worker died, leased to `owner` alone; jobs that already crashed
    workers `max_attempts` times on their own end `failed` on the way."""
    stmt = (
        select(IngestJob)
        .where(IngestJob.state == "running", IngestJob.lease_expires_at < t)
        .order_by(IngestJob.lease_expires_at, IngestJob.id)
        .limit(_TAKE_OVER_SCAN)
    )
    if skip_locked:
        stmt = stmt.with_for_update(skip_locked=True)
    for job in session.scalars(stmt).all():
        if job.claimed_with > 1:
            log.warning(
                "job %s: worker %s died holding %d jobs; retrying each alone, uncharged",
                job.id,
                job.lease_owner,
                job.claimed_with,
            )
        elif job.attempts >= job.max_attempts:
            _finish_failed(
                session,
                job,
                f"gave up after {job.attempts} attempts "
                "(the worker processing it stopped each time)",
            )
            continue
        else:
            log.warning("job %s: lease of %s expired, taking over", job.id, job.lease_owner)
            job.attempts += 1
        _lease(job, owner, lease_s, t, 1)
        return job
    return None


# Expired jobs looked at per claim: those past max_attempts are failed on the way to the first
# one that can still run.
_TAKE_OVER_SCAN = 16


def _lease(job: IngestJob, owner: str, lease_s: float, t: float, batch: int) -> None:
    job.state = "running"
    job.lease_owner = owner
    job.lease_expires_at = t + lease_s
    job.claimed_with = batch
    job.updated_at = t


def renew(db: Database, job: ClaimedJob, lease_s: float) -> bool:
    t = now()
    with db.write() as session:
        result = session.execute(
            update(IngestJob).where(_ours(job)).values(lease_expires_at=t + lease_s, updated_at=t)
        )
        return bool(result.rowcount)  # type: ignore[attr-defined]


def _ours(job: ClaimedJob) -> ColumnElement[bool]:
    return and_(
        IngestJob.id == job.id,
        IngestJob.state == "running",
        IngestJob.lease_owner == job.owner,
    )


def load_input(db: Database, job: ClaimedJob) -> JobInput | None:
    """The bytes and settings a job needs; None when its document is gone."""
    with db.read() as session:
        row = session.execute(
            select(Document, Collection, Blob.data)
            .join(Collection, Collection.id == Document.collection_id)
            .join(Blob, Blob.sha256 == Document.sha256)
            .where(Document.id == job.document_id)
        ).first()
    if row is None:
        return None
    doc, collection, data = row
    if doc.deleted_at is not None or collection.deleted_at is not None:
        return None
    return JobInput(
        data,
        doc.media_type,
        collection.embedding_model,
        collection.embedding_dim,
        collection.chunk_tokens,
        collection.chunk_overlap,
    )


def set_status(db: Database, held: list[ClaimedJob], status: str) -> None:
    """One transaction for a batch; jobs whose lease was lost are left alone."""
    with db.write() as session:
        ours = [
            job.document_id
            for job in held
            if session.scalar(select(IngestJob.id).where(_ours(job))) is not None
        ]
        if ours:
            session.execute(
                update(Document)
                .where(Document.id.in_(ours), Document.deleted_at.is_(None))
                .values(status=status, updated_at=now())
            )


def chunk_uid(document_id: str, row: ChunkRow) -> str:
    key = f"{document_id}:{row.ordinal}:{row.start_char}:{row.end_char}"
    return hashlib.sha256(key.encode()).hexdigest()


@dataclass(frozen=True)
class Finished:
    """A job ready to be written: its text, chunks and their vectors."""

    job: ClaimedJob
    text: str
    chunks: Sequence[ChunkRow]
    vectors: npt.NDArray[np.float32]


def complete(
    db: Database,
    job: ClaimedJob,
    *,
    text: str,
    chunks: Sequence[ChunkRow],
    vectors: npt.NDArray[np.float32],
    embedding_model: str,
) -> str:
    """One transaction: chunks with their vectors, change-log rows, document indexed, job
    done. Returns the job's final state."""
    state = complete_many(db, [Finished(job, text, chunks, vectors)], embedding_model)[job.id]
    if state == "lost":
        raise LeaseLost(job.id)
    return state


def complete_many(db: Database, batch: Sequence[Finished], embedding_model: str) -> dict[str, str]:
    """Write a batch of jobs in one transaction (one commit for the batch). Each job is still
    fenced on its own lease: a job whose lease was lost is skipped ("lost") and the others are
    written. Returns each job's final state: done, cancelled or lost."""
    states: dict[str, str] = {}
    with db.write() as session:
        # Collection rows locked in one order, so two workers cannot deadlock.
        for collection_id in sorted({f.job.collection_id for f in batch}):
            lock_collection(session, collection_id)
        for item in batch:
            states[item.job.id] = _write_job(session, item, embedding_model)
    return states


def _write_job(session: Session, item: Finished, embedding_model: str) -> str:
    job = item.job
    job_row = session.scalar(select(IngestJob).where(_ours(job)))
    if job_row is None:
        return "lost"
    doc = session.get(Document, job.document_id)
    t = now()
    if doc is None or doc.deleted_at is not None:
        job_row.state, job_row.error = "cancelled", "document deleted"
        job_row.finished_at = job_row.updated_at = t
        job_row.lease_owner = None
        return "cancelled"
    blobs = vector_codec.encode_rows(item.vectors)
    rows = [
        Chunk(
            uid=chunk_uid(doc.id, c),
            document_id=doc.id,
            collection_id=doc.collection_id,
            tenant_id=doc.tenant_id,
            ordinal=c.ordinal,
            text=c.text,
            start_char=c.start_char,
            end_char=c.end_char,
            token_count=c.token_count,
            embedding=blobs[i],
            embedding_model=embedding_model,
        )
        for i, c in enumerate(item.chunks)
    ]
    session.add_all(rows)
    session.flush()
    session.add_all(
        ChangeLog(collection_id=doc.collection_id, op="add", chunk_id=r.id, document_id=doc.id)
        for r in rows
    )
    doc.text = item.text
    doc.status = "indexed"
    doc.chunk_count = len(rows)
    doc.error = None
    doc.indexed_at = doc.updated_at = t
    job_row.state = "done"
    job_row.error = None
    job_row.finished_at = job_row.updated_at = t
    job_row.lease_owner = None
    job_row.lease_expires_at = None
    return "done"


def fail(
    db: Database,
    job: ClaimedJob,
    reason: str,
    *,
    permanent: bool,
    backoff_base_s: float,
    backoff_max_s: float,
) -> str:
    """Retry later with exponential backoff, or end the job `failed` with its reason."""
    with db.write() as session:
        job_row = session.scalar(select(IngestJob).where(_ours(job)))
        if job_row is None:
            raise LeaseLost(job.id)
        if permanent or job_row.attempts >= job_row.max_attempts:
            _finish_failed(session, job_row, reason)
            return "failed"
        delay = min(backoff_max_s, backoff_base_s * 2 ** (job_row.attempts - 1))
        t = now()
        job_row.state = "queued"
        job_row.error = reason
        job_row.run_after = t + delay
        job_row.lease_owner = None
        job_row.lease_expires_at = None
        job_row.updated_at = t
        session.execute(
            update(Document)
            .where(Document.id == job.document_id, Document.deleted_at.is_(None))
            .values(status="queued", error=reason, updated_at=t)
        )
        return "queued"


def _finish_failed(session: Session, job_row: IngestJob, reason: str) -> None:
    t = now()
    job_row.state = "failed"
    job_row.error = reason
    job_row.finished_at = job_row.updated_at = t
    job_row.lease_owner = None
    job_row.lease_expires_at = None
    session.execute(
        update(Document)
        .where(Document.id == job_row.document_id, Document.deleted_at.is_(None))
        .values(status="failed", error=reason, updated_at=t)
    )


def queue_depth(db: Database) -> dict[str, int]:
    with db.read() as session:
        rows = session.execute(
            select(IngestJob.state, func.count()).group_by(IngestJob.state)
        ).all()
    return {state: int(n) for state, n in rows}


def cancel(db: Database, job: ClaimedJob, reason: str) -> None:
    with db.write() as session:
        job_row = session.scalar(select(IngestJob).where(_ours(job)))
        if job_row is None:
            raise LeaseLost(job.id)
        t = now()
        job_row.state, job_row.error = "cancelled", reason
        job_row.finished_at = job_row.updated_at = t
        job_row.lease_owner = None


def cancel_jobs_where(session: Session, where: Any, reason: str) -> None:
    """Cancel the pending jobs `where` selects (their document or collection went away)."""
    t = now()
    session.execute(
        update(IngestJob)
        .where(where, IngestJob.state.in_(("queued", "running")))
        .values(state="cancelled", error=reason, finished_at=t, updated_at=t, lease_owner=None)
    )


def get(session: Session, tenant_id: str, job_id: str) -> IngestJob:
    job = session.scalar(
        select(IngestJob).where(IngestJob.id == job_id, IngestJob.tenant_id == tenant_id)
    )
    if job is None:
        raise NotFound(f"job {job_id} not found")
    return job


DONE_STATES = ("done", "failed", "cancelled")


def finished_states(db: Database, job_ids: Sequence[str]) -> dict[str, str]:
    """The jobs among `job_ids` that are finished, with their state."""
    if not job_ids:
        return {}
    with db.read() as session:
        rows = session.execute(
            select(IngestJob.id, IngestJob.state).where(
                IngestJob.id.in_(list(job_ids)), IngestJob.state.in_(DONE_STATES)
            )
        ).all()
    return {job_id: state for job_id, state in rows}
