"""The ingest queue in SQL: claim with a lease, renew, finish, retry.

PostgreSQL claims with `FOR UPDATE SKIP LOCKED`, so many workers never take one job twice;
SQLite claims inside `BEGIN IMMEDIATE`, which serialises claimers. Every state change after a
claim checks that the lease is still ours: a worker whose lease expired (and whose job another
worker took over) cannot write anything.

A claim is fair across tenants: it takes the tenants' oldest due jobs in turn (round-robin,
the tenant waiting longest first), so one tenant's flood of uploads delays another tenant's
upload by at most the batch in progress, never by the whole flood.

Due times and leases are stamped and compared on the database's clock (`clock`), never a
process's own: workers on machines whose clocks disagree agree on when a lease runs out.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import ColumnElement, and_, case, func, select, update
from sqlalchemy.orm import Session

from rag.db.models import Blob, Collection, Document, IngestJob, now
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
    tenant_id: str = ""


@dataclass(frozen=True)
class JobInput:
    data: bytes
    media_type: str
    embedding_model: str
    embedding_dim: int
    chunk_tokens: int
    chunk_overlap: int


def clock(session: Session) -> float:
    """The database server's time, in seconds since the epoch (PostgreSQL's clock_timestamp(),
    not now(): a claim may have waited on a lock since its transaction began)."""
    if session.get_bind().dialect.name == "postgresql":
        expr: ColumnElement[Any] = func.extract("epoch", func.clock_timestamp())
    else:  # julianday('now'): the database's clock, to the millisecond
        expr = (func.julianday("now") - 2440587.5) * 86400.0
    return float(session.execute(select(expr)).scalar_one())


def claim(db: Database, owner: str, lease_s: float) -> ClaimedJob | None:
    """Take one runnable job: running with an expired lease, else the oldest due job of the
    tenant that has waited longest."""
    claimed = claim_many(db, owner, lease_s, 1)
    return claimed[0] if claimed else None


def claim_many(
    db: Database,
    owner: str,
    lease_s: float,
    limit: int,
    max_bytes: int | None = None,
    *,
    exclude_tenants: Sequence[str] = (),
) -> list[ClaimedJob]:
    """Take up to `limit` runnable jobs in one transaction (one commit, not one per job),
    marking their documents `parsing`. Due jobs are taken round-robin across tenants (see
    `_fair_due`), and no more than `max_bytes` of documents (at least one job): a claim is
    processed whole, so a tenant that queued large files must not hold the worker for
    minutes while another tenant's upload waits behind the batch.

    A job whose worker died (its lease expired) comes first and comes alone. If that worker
    held a batch, nobody knows which job killed it, so the attempt is charged to none of them;
    each is retried on its own, and only a worker that dies holding one job charges it. A
    document that crashes workers thus ends `failed` after `max_attempts` solo tries, and its
    batch-mates are never failed with it.

    `exclude_tenants`: only other tenants' due jobs (a worker paused inside a long claim
    serves the tenants waiting behind it; jobs of dead workers wait for its next claim)."""
    with db.write() as session:
        t = clock(session)
        recovered = (
            None
            if exclude_tenants
            else _take_over(session, owner, lease_s, t, skip_locked=not db.is_sqlite)
        )
        if recovered is not None:
            taken = [recovered]
        else:
            taken = _fair_due(
                session, t, limit, skip_locked=not db.is_sqlite, exclude=exclude_tenants
            )
            if max_bytes is not None:
                taken = _within(session, taken, max_bytes)
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
            ClaimedJob(
                j.id, j.document_id, j.collection_id, j.attempts, j.max_attempts, owner, j.tenant_id
            )  # fmt: skip
            for j in taken
        ]


def _due(t: float, exclude: Sequence[str] = ()) -> ColumnElement[bool]:
    due = and_(IngestJob.state == "queued", IngestJob.run_after <= t)
    return and_(due, IngestJob.tenant_id.not_in(exclude)) if exclude else due


def _fair_due(
    session: Session, t: float, limit: int, *, skip_locked: bool, exclude: Sequence[str] = ()
) -> list[IngestJob]:
    """Up to `limit` due jobs, round-robin across tenants: each tenant's oldest first, the
    tenant served least recently first (then the oldest due job). A claim of n jobs thus holds
    one of each of the first n tenants waiting, however many jobs the first of them queued,
    and a claim cut short by its bytes is followed by one that starts with another tenant."""
    waiting = (
        select(IngestJob.tenant_id, func.min(IngestJob.run_after).label("oldest"))
        .where(_due(t, exclude))
        .group_by(IngestJob.tenant_id)
        .subquery()
    )
    served = (
        select(func.max(IngestJob.updated_at))
        .where(IngestJob.tenant_id == waiting.c.tenant_id, IngestJob.state != "queued")
        .correlate(waiting)
        .scalar_subquery()
    )
    tenants = session.scalars(
        select(waiting.c.tenant_id)
        .order_by(func.coalesce(served, 0.0), waiting.c.oldest, waiting.c.tenant_id)
        .limit(limit)
    ).all()
    oldest_first = (IngestJob.run_after, IngestJob.id)
    if not tenants:
        return []
    if len(tenants) == 1:
        # One tenant picked (the only one waiting, or `limit` is 1): its oldest jobs, in one
        # statement. Other tenants' jobs sort after all of its own, so they are taken only when
        # a concurrent claim holds the picked tenant's (PostgreSQL skips locked rows) and this
        # claim would otherwise come back short.
        others_last = case((IngestJob.tenant_id == tenants[0], 0), else_=1)
        stmt = (
            select(IngestJob)
            .where(_due(t, exclude))
            .order_by(others_last, *oldest_first)
            .limit(limit)
        )
        if skip_locked:
            stmt = stmt.with_for_update(skip_locked=True)
        return list(session.scalars(stmt))
    queues = [
        list(
            session.scalars(
                select(IngestJob.id)
                .where(_due(t, exclude), IngestJob.tenant_id == tenant_id)
                .order_by(*oldest_first)
                .limit(limit)
            )
        )
        for tenant_id in tenants
    ]
    order = [q[i] for i in range(max(map(len, queues))) for q in queues if i < len(q)][:limit]
    # Locked (and checked again) only now: a job another worker claimed meanwhile is skipped.
    stmt = select(IngestJob).where(IngestJob.id.in_(order), _due(t, exclude))
    if skip_locked:
        stmt = stmt.with_for_update(skip_locked=True)
    rows = {job.id: job for job in session.scalars(stmt)}
    return [rows[job_id] for job_id in order if job_id in rows]


def _within(session: Session, taken: list[IngestJob], max_bytes: int) -> list[IngestJob]:
    """The first of `taken` whose documents' bytes add up to at most `max_bytes` (at least
    one); the rest stay queued (their row locks go at commit)."""
    if len(taken) <= 1:
        return taken
    sizes = dict(
        session.execute(
            select(Document.id, Document.size).where(
                Document.id.in_([job.document_id for job in taken])
            )
        ).all()
    )
    kept: list[IngestJob] = []
    total = 0
    for job in taken:
        total += int(sizes.get(job.document_id) or 0)
        if kept and total > max_bytes:
            break
        kept.append(job)
    return kept


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
    with db.write() as session:
        t = clock(session)
        result = session.execute(
            update(IngestJob).where(ours(job)).values(lease_expires_at=t + lease_s, updated_at=t)
        )
        return bool(result.rowcount)  # type: ignore[attr-defined]


def ours(job: ClaimedJob) -> ColumnElement[bool]:
    """The job's row while `job`'s lease still holds it: every write after a claim fences on
    this, so a worker whose lease expired writes nothing."""
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
            .join(Blob, (Blob.tenant_id == Document.tenant_id) & (Blob.sha256 == Document.sha256))
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
        held_docs = [
            job.document_id
            for job in held
            if session.scalar(select(IngestJob.id).where(ours(job))) is not None
        ]
        if held_docs:
            session.execute(
                update(Document)
                .where(Document.id.in_(held_docs), Document.deleted_at.is_(None))
                .values(status=status, updated_at=now())
            )


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
        job_row = session.scalar(select(IngestJob).where(ours(job)))
        if job_row is None:
            raise LeaseLost(job.id)
        if permanent or job_row.attempts >= job_row.max_attempts:
            _finish_failed(session, job_row, reason)
            return "failed"
        delay = min(backoff_max_s, backoff_base_s * 2 ** (job_row.attempts - 1))
        t = clock(session)
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
        job_row = session.scalar(select(IngestJob).where(ours(job)))
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
