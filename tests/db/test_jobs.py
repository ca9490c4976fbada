"""The ingest queue (rag.db.jobs): claims honour leases and due times, take tenants in turn,
retry with exponential backoff, and fence every write on the lease."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

import pytest
from sqlalchemy import select, update

from rag.db import Database, collections, documents, jobs
from rag.db.jobs import ClaimedJob, LeaseLost
from rag.db.models import Document, IngestJob
from rag.errors import NotFound
from tests.db.conftest import Make

LEASE_S = 60.0
EXPIRED = -1.0  # a lease that has already run out: its worker is dead


def _claim(db: Database, owner: str, lease_s: float = LEASE_S) -> ClaimedJob | None:
    return jobs.claim(db, owner, lease_s)


def _job(db: Database, job_id: str) -> IngestJob:
    with db.read() as s:
        row = s.get(IngestJob, job_id)
        assert row is not None
        return row


def _status(db: Database, document_id: str) -> str:
    with db.read() as s:
        doc = s.get(Document, document_id)
        assert doc is not None
        return doc.status


def _now(db: Database) -> float:
    with db.read() as s:
        return jobs.clock(s)


def _due_at(db: Database, job_ids: Sequence[str], ages_s: Sequence[float]) -> None:
    """Make each job due `age` seconds ago (claims take the oldest first)."""
    t = _now(db)
    with db.write() as s:
        for job_id, age in zip(job_ids, ages_s, strict=True):
            s.execute(update(IngestJob).where(IngestJob.id == job_id).values(run_after=t - age))


def _queue(make: Make, collection_id: str, n: int, **kw: object) -> list[tuple[str, str]]:
    """(job id, document id) of `n` uploads, oldest due first."""
    out = []
    for _ in range(n):
        accepted = make.upload(collection_id, **kw)  # type: ignore[arg-type]
        assert accepted.job is not None
        out.append((accepted.job.id, accepted.document.id))
    _due_at(make.db, [j for j, _ in out], [100.0 - i for i in range(n)])
    return out


def _flood_and_one(make: Make) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """A tenant's three jobs, all due before another tenant's one."""
    flood = _queue(make, make.collection(make.tenant()), 3)
    other = _queue(make, make.collection(make.tenant()), 1)
    _due_at(make.db, [j for j, _ in flood + other], [30, 29, 28, 10])
    return flood, other


def test_a_claim_takes_the_oldest_due_job_and_a_live_lease_keeps_it(
    db: Database, make: Make
) -> None:
    tenant = make.tenant()
    (job_a, doc_a), (job_b, _) = _queue(make, make.collection(tenant), 2)

    first = _claim(db, "w1")
    assert first is not None
    assert (first.id, first.document_id, first.attempt, first.owner) == (job_a, doc_a, 1, "w1")
    assert first.tenant_id == tenant
    row = _job(db, job_a)
    assert (row.state, row.lease_owner, row.attempts) == ("running", "w1", 1)
    assert row.lease_expires_at is not None
    assert row.lease_expires_at - _now(db) == pytest.approx(LEASE_S, abs=5)
    assert _status(db, doc_a) == "parsing"

    second = _claim(db, "w2")
    assert second is not None and second.id == job_b  # not job a again: its lease holds
    assert _claim(db, "w3") is None


def test_an_expired_lease_is_taken_over_and_its_old_owner_can_write_nothing(
    db: Database, make: Make
) -> None:
    [(job_id, doc_id)] = _queue(make, make.collection(make.tenant()), 1)
    dead = _claim(db, "w1", EXPIRED)
    assert dead is not None

    taken = _claim(db, "w2")
    assert taken is not None
    assert (taken.id, taken.attempt, taken.owner) == (job_id, 2, "w2")

    assert jobs.renew(db, dead, LEASE_S) is False
    jobs.set_status(db, [dead], "embedding")
    assert _status(db, doc_id) == "parsing"
    with pytest.raises(LeaseLost):
        jobs.fail(db, dead, "x", permanent=False, backoff_base_s=1, backoff_max_s=1)
    with pytest.raises(LeaseLost):
        jobs.cancel(db, dead, "x")
    row = _job(db, job_id)
    assert (row.state, row.lease_owner, row.attempts) == ("running", "w2", 2)

    assert jobs.renew(db, taken, 300.0) is True
    assert _job(db, job_id).lease_expires_at - _now(db) == pytest.approx(300.0, abs=5)  # type: ignore[operator]


def test_a_failed_attempt_waits_an_exponential_backoff_capped_then_fails_for_good(
    db: Database, make: Make
) -> None:
    [(job_id, doc_id)] = _queue(make, make.collection(make.tenant()), 1, max_attempts=5)
    delays = []
    for _ in range(4):
        held = _claim(db, "w")
        assert held is not None and held.id == job_id
        state = jobs.fail(
            db, held, "parser crashed", permanent=False, backoff_base_s=10, backoff_max_s=50
        )
        assert state == "queued"
        row = _job(db, job_id)
        assert (row.state, row.error, row.lease_owner) == ("queued", "parser crashed", None)
        assert _status(db, doc_id) == "queued"
        delays.append(row.run_after - _now(db))
        assert _claim(db, "w") is None  # not due before its backoff is over
        _due_at(db, [job_id], [0.0])
    assert delays == pytest.approx([10, 20, 40, 50], abs=2)

    last = _claim(db, "w")
    assert last is not None and last.attempt == 5
    assert jobs.fail(db, last, "still", permanent=False, backoff_base_s=10, backoff_max_s=50) == (
        "failed"
    )
    row = _job(db, job_id)
    assert (row.state, row.error) == ("failed", "still")
    assert row.finished_at is not None
    assert _status(db, doc_id) == "failed"
    assert _claim(db, "w") is None


def test_a_permanent_failure_ends_the_job_at_its_first_attempt(db: Database, make: Make) -> None:
    [(job_id, doc_id)] = _queue(make, make.collection(make.tenant()), 1, max_attempts=5)
    held = _claim(db, "w")
    assert held is not None
    assert jobs.fail(db, held, "bad pdf", permanent=True, backoff_base_s=1, backoff_max_s=1) == (
        "failed"
    )
    assert (_job(db, job_id).state, _status(db, doc_id)) == ("failed", "failed")
    assert jobs.finished_states(db, [job_id, "nope"]) == {job_id: "failed"}


def test_a_claim_takes_tenants_in_turn_however_many_jobs_one_queued(
    db: Database, make: Make
) -> None:
    flood, other = _flood_and_one(make)

    batch = jobs.claim_many(db, "w", LEASE_S, 3)
    assert [j.id for j in batch] == [flood[0][0], other[0][0], flood[1][0]]
    assert [_status(db, d) for _, d in flood] == ["parsing", "parsing", "queued"]
    assert {_job(db, j.id).claimed_with for j in batch} == {3}


def test_the_next_claim_starts_with_the_tenant_served_least_recently(
    db: Database, make: Make
) -> None:
    flood = _queue(make, make.collection(make.tenant()), 3)
    second = _queue(make, make.collection(make.tenant()), 1)
    third = _queue(make, make.collection(make.tenant()), 1)
    _due_at(db, [j for j, _ in flood + second + third], [30, 29, 28, 20, 10])

    first_claim = jobs.claim_many(db, "w", LEASE_S, 2)
    assert [j.id for j in first_claim] == [flood[0][0], second[0][0]]
    next_claim = jobs.claim_many(db, "w", LEASE_S, 2)
    assert [j.id for j in next_claim] == [third[0][0], flood[1][0]]


def test_one_claim_at_a_time_serves_the_tenant_served_least_recently(
    db: Database, make: Make
) -> None:
    flood, other = _flood_and_one(make)
    claimed = [_claim(db, "w") for _ in range(4)]
    assert [c.id if c else None for c in claimed] == [
        flood[0][0], other[0][0], flood[1][0], flood[2][0]
    ]  # fmt: skip


def test_exclude_tenants_claims_only_the_others_and_leaves_dead_workers_jobs(
    db: Database, make: Make
) -> None:
    busy = make.tenant()
    busy_jobs = _queue(make, make.collection(busy), 2)
    other_jobs = _queue(make, make.collection(make.tenant()), 2)
    dead = _claim(db, "w1", EXPIRED)
    assert dead is not None and dead.id == busy_jobs[0][0]

    batch = jobs.claim_many(db, "w2", LEASE_S, 5, exclude_tenants=[busy])
    assert sorted(j.id for j in batch) == sorted(j for j, _ in other_jobs)
    assert _job(db, busy_jobs[0][0]).lease_owner == "w1"  # not taken over
    assert _job(db, busy_jobs[1][0]).state == "queued"

    recovered = _claim(db, "w3")
    assert recovered is not None and recovered.id == dead.id


def test_max_bytes_cuts_a_batch_short_but_always_takes_one_job(db: Database, make: Make) -> None:
    cid = make.collection(make.tenant())
    queued = []
    for i in range(3):
        accepted = make.upload(cid, bytes([i]) * 100)
        assert accepted.job is not None
        queued.append((accepted.job.id, accepted.document.id))
    _due_at(db, [j for j, _ in queued], [30, 20, 10])

    first = jobs.claim_many(db, "w", LEASE_S, 3, max_bytes=250)
    assert [j.id for j in first] == [queued[0][0], queued[1][0]]
    assert _job(db, queued[2][0]).state == "queued"
    assert _job(db, queued[2][0]).attempts == 0
    rest = jobs.claim_many(db, "w", LEASE_S, 3, max_bytes=10)
    assert [j.id for j in rest] == [queued[2][0]]


def test_a_worker_that_dies_holding_a_batch_charges_none_of_its_jobs(
    db: Database, make: Make
) -> None:
    queued = _queue(make, make.collection(make.tenant()), 3)
    assert len(jobs.claim_many(db, "w1", EXPIRED, 3)) == 3

    alone = [_claim(db, f"r{i}") for i in range(3)]
    assert sorted(j.id for j in alone if j) == sorted(j for j, _ in queued)
    assert [j.attempt for j in alone if j] == [1, 1, 1]  # uncharged
    assert [_job(db, j).claimed_with for j, _ in queued] == [1, 1, 1]


def test_a_job_that_kills_its_worker_alone_is_charged_and_fails_at_its_last_attempt(
    db: Database, make: Make
) -> None:
    [(job_id, doc_id)] = _queue(make, make.collection(make.tenant()), 1, max_attempts=2)
    assert _claim(db, "w1", EXPIRED) is not None
    retried = _claim(db, "w2", EXPIRED)
    assert retried is not None and retried.attempt == 2

    assert _claim(db, "w3") is None
    row = _job(db, job_id)
    assert row.state == "failed"
    assert row.error is not None and "gave up after 2 attempts" in row.error
    assert _status(db, doc_id) == "failed"


def test_set_status_moves_only_the_documents_whose_lease_is_held(db: Database, make: Make) -> None:
    (_, doc_a), (_, doc_b) = _queue(make, make.collection(make.tenant()), 2)
    held = _claim(db, "w1")
    lost = _claim(db, "w1", EXPIRED)
    assert held is not None and lost is not None
    assert _claim(db, "w2") is not None  # takes `lost` over

    jobs.set_status(db, [held, lost], "embedding")
    assert (_status(db, doc_a), _status(db, doc_b)) == ("embedding", "parsing")


def test_load_input_gives_the_bytes_and_settings_until_the_document_is_deleted(
    db: Database, make: Make
) -> None:
    tenant = make.tenant()
    cid = make.collection(tenant, chunk_tokens=77, chunk_overlap=7)
    accepted = make.upload(cid, b"the bytes")
    held = _claim(db, "w")
    assert held is not None

    got = jobs.load_input(db, held)
    assert got is not None
    assert (got.data, got.media_type, got.chunk_tokens, got.chunk_overlap) == (
        b"the bytes", "text/plain", 77, 7
    )  # fmt: skip
    assert (got.embedding_dim, got.embedding_model) == (4, "test-4")

    with db.write() as s:
        documents.delete(s, tenant, accepted.document.id)
    assert jobs.load_input(db, held) is None
    assert _job(db, held.id).state == "cancelled"  # the delete cancelled the running job


def test_cancel_and_the_queue_counts(db: Database, make: Make) -> None:
    tenant, stranger = make.tenant(), make.tenant()
    (first, _), (second, _), (third, _) = _queue(make, make.collection(tenant), 3)
    held = _claim(db, "w")
    assert held is not None and held.id == first
    assert jobs.queue_depth(db) == {"running": 1, "queued": 2}

    jobs.cancel(db, held, "operator")
    row = _job(db, first)
    assert (row.state, row.error, row.lease_owner) == ("cancelled", "operator", None)
    assert jobs.finished_states(db, [first, second]) == {first: "cancelled"}
    assert jobs.finished_states(db, []) == {}

    with db.write() as s:
        jobs.cancel_jobs_where(s, IngestJob.id.in_([first, second]), "gone")
    assert _job(db, first).error == "operator"  # a finished job stays as it ended
    assert (_job(db, second).state, _job(db, second).error) == ("cancelled", "gone")
    assert jobs.queue_depth(db) == {"cancelled": 2, "queued": 1}

    with db.read() as s:
        assert jobs.get(s, tenant, third).id == third
        with pytest.raises(NotFound):
            jobs.get(s, stranger, third)


@pytest.mark.parametrize("deleted", ["collection", "document"])
def test_a_delete_waits_for_a_claim_rather_than_deadlock_with_it(
    db: Database, make: Make, deleted: str
) -> None:
    """A claim locks its job, then marks the job's document; a delete of the collection or
    the document cancels its jobs before it tombstones the documents, the same order. Taken
    the other way, the claim and the delete each held what the other waited for, and
    PostgreSQL aborted one of them."""
    if db.is_sqlite:
        pytest.skip("SQLite has one writer at a time: there is no order to get wrong")
    tenant = make.tenant()
    cid = make.collection(tenant)
    [(job_id, doc_id)] = _queue(make, cid, 1)
    errors: list[BaseException] = []

    def delete() -> None:
        try:
            with db.write() as s:
                if deleted == "collection":
                    collections.delete(s, tenant, cid)
                else:
                    documents.delete(s, tenant, doc_id)
        except BaseException as e:  # noqa: BLE001 - reported by the test
            errors.append(e)

    with db.write() as s:  # the claim's order (jobs.claim_many): the job's row, then its document
        s.execute(select(IngestJob).where(IngestJob.id == job_id).with_for_update()).one()
        deleting = threading.Thread(target=delete)
        deleting.start()
        time.sleep(0.5)  # the delete now waits on the job's row (or, before, held the document)
        s.execute(update(Document).where(Document.id == doc_id).values(status="parsing"))
    deleting.join(timeout=30)
    assert not deleting.is_alive() and errors == []
    assert _job(db, job_id).state == "cancelled" and _status(db, doc_id) == "deleted"
