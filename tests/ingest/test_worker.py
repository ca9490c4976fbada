"""The queue and the worker on real databases: leases, takeover, retries, exactly once."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt
import pytest
from sqlalchemy import func, select

from ingest.pipeline import Pipeline
from ingest.worker import Worker
from rag.config import IngestAdvanced, IngestSettings
from rag.db import Database, collections, documents, ingested, jobs
from rag.db.jobs import LeaseLost
from rag.db.models import Chunk, Document, IngestJob, Tenant
from rag.embed import HashEmbedder


def _collection(db: Database, embedder: HashEmbedder, tenant_name: str = "t") -> str:
    with db.write() as s:
        tenant = Tenant(name=tenant_name)
        s.add(tenant)
        s.flush()
        c = collections.create(
            s,
            tenant.id,
            name="c",
            embedding_model=embedder.model_id,
            embedding_dim=embedder.dim,
            chunk_tokens=64,
            chunk_overlap=8,
            index_kind="auto",
            index_params={},
            search_defaults={},
        )
        return c.id


def _upload(db: Database, cid: str, text: str, max_attempts: int = 5) -> str:
    import hashlib

    data = text.encode()
    with db.write() as s:
        collection = collections.get(s, _tenant_of(s, cid), cid)
        acc = documents.add(
            s,
            collection,
            filename="t.txt",
            media_type="text/plain",
            data=data,
            sha256=hashlib.sha256(data).hexdigest(),
            meta={},
            max_attempts=max_attempts,
        )
        assert acc.job is not None
        return acc.job.id


def _tenant_of(session, cid: str) -> str:  # type: ignore[no-untyped-def]
    from rag.db.models import Collection

    return session.get(Collection, cid).tenant_id  # type: ignore[no-any-return]


SETTINGS = IngestSettings(
    advanced=IngestAdvanced(
        lease_s=0.5, backoff_base_s=0.01, backoff_max_s=0.05, poll_interval_s=0.01
    )
)


def test_claim_takes_a_job_once_and_expired_leases_are_taken_over(db: Database) -> None:
    emb = HashEmbedder()
    cid = _collection(db, emb)
    job_id = _upload(db, cid, "alpha beta gamma")
    first = jobs.claim(db, "w1", lease_s=0.3)
    assert first is not None and first.id == job_id and first.attempt == 1
    assert jobs.claim(db, "w2", lease_s=0.3) is None  # leased
    time.sleep(0.4)
    second = jobs.claim(db, "w2", lease_s=5)
    assert second is not None and second.id == job_id and second.attempt == 2
    # The first worker's lease is gone: it can write nothing.
    with pytest.raises(LeaseLost):
        ingested.complete(
            db,
            first,
            text="x",
            chunks=[],
            vectors=np.zeros((0, 384), np.float32),
            embedding_model=emb.model_id,
        )
    assert not jobs.renew(db, first, 5)
    assert jobs.renew(db, second, 5)


def test_pipeline_indexes_exactly_once_even_when_run_twice(db: Database) -> None:
    emb = HashEmbedder()
    cid = _collection(db, emb)
    job_id = _upload(db, cid, "word " * 500)
    worker = Worker(db, Pipeline(db, emb, SETTINGS), SETTINGS)
    assert worker.run_once()
    assert not worker.run_once()  # nothing left
    with db.read() as s:
        job = s.get(IngestJob, job_id)
        assert job is not None and job.state == "done"
        doc = s.get(Document, job.document_id)
        n = s.scalar(select(func.count()).select_from(Chunk))
    assert doc is not None and doc.status == "indexed" and doc.chunk_count == n and n > 1


class FlakyEmbedder(HashEmbedder):
    """Fails the first `failures` calls, then works: a stand-in for a transient fault."""

    def __init__(self, failures: int) -> None:
        super().__init__()
        self.failures = failures

    def embed(self, texts: Sequence[str], deadline: object = None) -> npt.NDArray[np.float32]:
        if self.failures > 0:
            self.failures -= 1
            raise RuntimeError("transient embedding fault")
        return super().embed(texts)


def test_transient_failures_are_retried_with_backoff(db: Database) -> None:
    emb = FlakyEmbedder(failures=2)
    cid = _collection(db, emb)
    job_id = _upload(db, cid, "retry me please")
    worker = Worker(db, Pipeline(db, emb, SETTINGS), SETTINGS)
    stop = threading.Event()
    thread = worker.start_thread(stop)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        with db.read() as s:
            job = s.get(IngestJob, job_id)
            assert job is not None
            if job.state in ("done", "failed"):
                break
        time.sleep(0.05)
    stop.set()
    thread.join()
    assert job.state == "done" and job.attempts == 3


def test_a_job_that_keeps_failing_ends_failed_with_its_reason(db: Database) -> None:
    emb = FlakyEmbedder(failures=100)
    cid = _collection(db, emb)
    job_id = _upload(db, cid, "never works", max_attempts=3)
    worker = Worker(db, Pipeline(db, emb, SETTINGS), SETTINGS)
    for _ in range(50):
        worker.run_once()
        with db.read() as s:
            job = s.get(IngestJob, job_id)
            assert job is not None
            if job.state == "failed":
                break
        time.sleep(0.03)
    assert job.state == "failed" and job.attempts == 3
    assert "transient embedding fault" in (job.error or "")
    with db.read() as s:
        doc = s.get(Document, job.document_id)
        assert doc is not None and doc.status == "failed" and doc.error


def test_a_job_whose_worker_always_dies_ends_failed(db: Database) -> None:
    emb = HashEmbedder()
    cid = _collection(db, emb)
    job_id = _upload(db, cid, "poison", max_attempts=2)
    for _ in range(2):
        assert jobs.claim(db, "doomed", lease_s=0.05) is not None
        time.sleep(0.1)  # the worker "died": its lease runs out
    assert jobs.claim(db, "next", lease_s=5) is None
    with db.read() as s:
        job = s.get(IngestJob, job_id)
        assert job is not None and job.state == "failed" and "gave up" in (job.error or "")


def test_a_worker_dying_with_a_batch_charges_none_of_it(db: Database) -> None:
    """Which job of a batch killed its worker is unknown: each is retried alone, uncharged;
    only a worker dying with one job in hand charges that job."""
    emb = HashEmbedder()
    cid = _collection(db, emb)
    ids = {_upload(db, cid, f"batch-mate {i}", max_attempts=2) for i in range(3)}
    held = jobs.claim_many(db, "doomed", lease_s=0.05, limit=8)
    assert {j.id for j in held} == ids
    time.sleep(0.1)  # the worker "died" with all three: their leases run out
    retaken = jobs.claim_many(db, "solo", lease_s=0.05, limit=8)
    assert len(retaken) == 1 and retaken[0].attempt == 1  # alone, not charged
    time.sleep(0.1)  # that solo worker died too
    # The other two are taken over alone and uncharged as well (by workers that live on)...
    for _ in range(2):
        [mate] = jobs.claim_many(db, "alive", lease_s=30, limit=8)
        assert mate.id != retaken[0].id and mate.attempt == 1
    # ...and the job that killed a worker on its own is charged this time.
    again = jobs.claim_many(db, "solo-2", lease_s=0.05, limit=8)
    assert [j.id for j in again] == [retaken[0].id] and again[0].attempt == 2
    time.sleep(0.1)
    with db.write() as s:  # the live workers let go of their two
        for job in s.scalars(select(IngestJob).where(IngestJob.lease_owner == "alive")):
            job.state, job.lease_owner, job.lease_expires_at = "queued", None, None
    with db.read() as s:
        states = {i: s.get(IngestJob, i).state for i in ids}  # type: ignore[union-attr]
    assert "failed" not in states.values()
    # A worker that finishes its work: the two uncharged batch-mates are done, and the job
    # that killed two solo workers ends failed with its reason.
    worker = Worker(db, Pipeline(db, emb, SETTINGS), SETTINGS)
    while worker.run_once():
        pass
    with db.read() as s:
        final = {i: s.get(IngestJob, i) for i in ids}
    failed = [j for j in final.values() if j is not None and j.state == "failed"]
    assert (
        len(failed) == 1 and failed[0].id == retaken[0].id and "gave up" in (failed[0].error or "")
    )
    assert sorted(j.state for j in final.values() if j is not None) == ["done", "done", "failed"]


def test_wrong_embedding_model_fails_permanently(db: Database) -> None:
    cid = _collection(db, HashEmbedder(384))
    job_id = _upload(db, cid, "model mismatch")
    other = HashEmbedder(128)
    worker = Worker(db, Pipeline(db, other, SETTINGS), SETTINGS)
    assert worker.run_once()
    with db.read() as s:
        job = s.get(IngestJob, job_id)
        assert job is not None and job.state == "failed" and job.attempts == 1
        assert "hash-384" in (job.error or "")


def test_a_batch_of_jobs_is_embedded_in_one_call(db: Database) -> None:
    emb = HashEmbedder()
    cid = _collection(db, emb)
    ids = [_upload(db, cid, f"document {i} " + "word " * (60 * (i + 1))) for i in range(5)]
    settings = IngestSettings(advanced=IngestAdvanced(lease_s=5, claim_batch=8))
    worker = Worker(db, Pipeline(db, emb, settings), settings)
    emb.calls.clear()
    assert worker.run_once()
    with db.read() as s:
        states = [s.get(IngestJob, i).state for i in ids]  # type: ignore[union-attr]
        chunks = s.scalar(select(func.count()).select_from(Chunk))
    assert states == ["done"] * 5
    assert emb.calls == [chunks]  # every job's chunks in a single encode call


def test_one_bad_job_in_a_batch_fails_alone(db: Database) -> None:
    emb = HashEmbedder()
    cid = _collection(db, emb)
    good = _upload(db, cid, "a perfectly fine document")
    # An HTML job whose bytes are not text fails in parsing; the batch carries on.
    import hashlib

    data = b"\xff\xfe\x00garbage\x00"
    with db.write() as s:
        collection = collections.get(s, _tenant_of(s, cid), cid)
        bad = documents.add(
            s,
            collection,
            filename="x.html",
            media_type="text/html",
            data=data,
            sha256=hashlib.sha256(data).hexdigest(),
            meta={},
            max_attempts=3,
        ).job.id  # type: ignore[union-attr]
    settings = IngestSettings(parse_timeout_s=20, advanced=IngestAdvanced(lease_s=5, claim_batch=8))
    worker = Worker(db, Pipeline(db, emb, settings), settings)
    assert worker.run_once()
    with db.read() as s:
        assert s.get(IngestJob, good).state == "done"  # type: ignore[union-attr]
        assert s.get(IngestJob, bad).state == "failed"  # type: ignore[union-attr]


def test_a_batch_write_skips_a_job_whose_lease_was_lost(db: Database) -> None:
    from sqlalchemy import update

    from rag.db.ingested import ChunkRow, Finished, complete_many
    from rag.db.jobs import claim_many

    emb = HashEmbedder()
    cid = _collection(db, emb)
    first, second = _upload(db, cid, "one"), _upload(db, cid, "two")
    held = claim_many(db, "a", 60, 2)
    assert {j.id for j in held} == {first, second}
    with db.write() as s:  # another worker took the second job over
        s.execute(update(IngestJob).where(IngestJob.id == second).values(lease_owner="b"))
    row = ChunkRow(0, "text", 0, 4, 1)
    vec = emb.embed(["text"])
    states = complete_many(db, [Finished(j, "text", [row], vec) for j in held], emb.model_id)
    assert states == {first: "done", second: "lost"}
    with db.read() as s:
        owners = dict(
            s.execute(select(Chunk.document_id, func.count()).group_by(Chunk.document_id)).all()
        )
        done = s.get(IngestJob, first)
        assert done is not None and owners == {done.document_id: 1}
        assert s.get(IngestJob, second).state == "running"  # type: ignore[union-attr]


def test_a_failed_batch_write_falls_back_to_one_job_at_a_time(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rag.db import ingested as jobs_module

    emb = HashEmbedder()
    cid = _collection(db, emb)
    ids = [_upload(db, cid, f"document {i} with some words") for i in range(3)]
    real = jobs_module.complete_many
    batches: list[int] = []

    def flaky(db_, batch, model):  # type: ignore[no-untyped-def]
        batches.append(len(batch))
        if len(batch) > 1:
            raise RuntimeError("the batch transaction failed")
        return real(db_, batch, model)

    monkeypatch.setattr(jobs_module, "complete_many", flaky)
    settings = IngestSettings(advanced=IngestAdvanced(lease_s=5, claim_batch=8))
    worker = Worker(db, Pipeline(db, emb, settings), settings)
    assert worker.run_once()
    assert batches == [3, 1, 1, 1]
    with db.read() as s:
        assert [s.get(IngestJob, i).state for i in ids] == ["done"] * 3  # type: ignore[union-attr]


def test_a_claim_takes_tenants_in_turn_not_one_tenants_flood(db: Database) -> None:
    """FIFO claims put one tenant's flood ahead of everyone: tenant b's single upload waited
    behind all of a's. A claim now takes the tenants' oldest jobs in turn."""
    emb = HashEmbedder()
    flood, other, third = (_collection(db, emb, name) for name in ("a", "b", "c"))
    a_jobs = [_upload(db, flood, f"flood {i}") for i in range(10)]
    b_jobs = [_upload(db, other, f"other {i}") for i in range(2)]
    c_job = _upload(db, third, "third")
    held = jobs.claim_many(db, "w", lease_s=30, limit=5)
    # a waited longest, then b, then c; each tenant's own jobs oldest first.
    assert [j.id for j in held] == [a_jobs[0], b_jobs[0], c_job, a_jobs[1], b_jobs[1]]
    rest = jobs.claim_many(db, "w", lease_s=30, limit=64)
    assert [j.id for j in rest] == a_jobs[2:]
    assert jobs.claim_many(db, "w", lease_s=30, limit=64) == []


def test_a_flood_delays_another_tenant_by_one_batch_at_most(db: Database) -> None:
    emb = HashEmbedder()
    flood, other = _collection(db, emb, "a"), _collection(db, emb, "b")
    for i in range(40):
        _upload(db, flood, f"flood {i}")
    late = _upload(db, other, "uploaded after the flood")
    settings = IngestSettings(advanced=IngestAdvanced(lease_s=5, claim_batch=8))
    worker = Worker(db, Pipeline(db, emb, settings), settings)
    assert worker.run_once()  # the first batch
    with db.read() as s:
        assert s.get(IngestJob, late).state == "done"  # type: ignore[union-attr]
        done = s.scalar(
            select(func.count()).select_from(IngestJob).where(IngestJob.state == "done")
        )
    assert done == 8


def test_worker_threads_run_at_a_lower_priority(db: Database) -> None:
    """Ingest takes the CPU that searches and answers leave: the worker's thread (and what it
    starts: the torch team that embeds its batches, the parser children) runs niced."""
    import os

    seen: list[int] = []
    settings = IngestSettings(worker_nice=7, advanced=IngestAdvanced(poll_interval_s=0.01))
    worker = Worker(db, Pipeline(db, HashEmbedder(), settings), settings)
    stop = threading.Event()
    real = worker.run_once

    def probe() -> bool:
        seen.append(os.getpriority(os.PRIO_PROCESS, threading.get_native_id()))
        stop.set()
        return real()

    worker.run_once = probe  # type: ignore[method-assign]
    before = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    thread = worker.start_thread(stop)
    thread.join(10)
    assert seen == [min(19, before + 7)]
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == before  # not ours


def test_a_one_token_word_is_chunked_within_the_character_bound(db: Database) -> None:
    emb = HashEmbedder()
    cid = _collection(db, emb)
    _upload(db, cid, "Before it. " + "x" * 300_000 + " after it.")
    worker = Worker(db, Pipeline(db, emb, SETTINGS), SETTINGS)
    assert worker.run_once()
    with db.read() as s:
        lengths = [len(t) for t in s.scalars(select(Chunk.text))]
    assert lengths and max(lengths) <= 64 * SETTINGS.advanced.chunk_chars_per_token


@pytest.mark.timeout(60)
def test_markdown_is_parsed_under_the_time_limit() -> None:
    """Markdown was parsed in the worker's (the API's) own process with no time limit:
    a few MB of `[` held a core for over a minute. It now runs where the other parsers do."""
    from ingest.pipeline import PermanentFailure
    from rag.upload.detect import MARKDOWN

    settings = IngestSettings(parse_timeout_s=0.5)
    pipeline = Pipeline(None, HashEmbedder(), settings)  # type: ignore[arg-type]
    started = time.monotonic()
    with pytest.raises(PermanentFailure, match="timed out"):
        pipeline.parse(b"[" * 3_000_000, MARKDOWN)
    assert time.monotonic() - started < 10
    assert pipeline.parse(b"# Title\n\nSome [link](x).\n", MARKDOWN).startswith("# Title")


def test_a_database_outage_is_waited_out_not_charged_to_the_document(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each transient database error (connection lost, database locked) was one failed
    attempt: with the backoff's first steps a short outage used every attempt and failed the
    document for good. The step is now retried in place, with backoff, and the attempt
    counts only when the outage outlasts `transient_retry_s`."""
    from sqlalchemy.exc import OperationalError

    emb = HashEmbedder()
    cid = _collection(db, emb)
    job_id = _upload(db, cid, "written after the outage", max_attempts=3)
    outage_ends = time.monotonic() + 1.0

    def down(real):  # type: ignore[no-untyped-def]
        def call(*args, **kwargs):  # type: ignore[no-untyped-def]
            if time.monotonic() < outage_ends:
                raise OperationalError("SELECT 1", {}, Exception("server closed the connection"))
            return real(*args, **kwargs)

        return call

    monkeypatch.setattr(ingested, "complete_many", down(ingested.complete_many))
    monkeypatch.setattr(ingested, "complete", down(ingested.complete))
    settings = IngestSettings(
        advanced=IngestAdvanced(lease_s=5, backoff_base_s=0.01, backoff_max_s=0.05)
    )
    worker = Worker(db, Pipeline(db, emb, settings), settings)
    for _ in range(100):
        worker.run_once()
        with db.read() as s:
            job = s.get(IngestJob, job_id)
            assert job is not None
            if job.state in ("done", "failed"):
                break
        time.sleep(0.02)
    assert job.state == "done" and job.attempts == 1, (job.state, job.attempts, job.error)


def test_leases_run_on_the_databases_clock_not_the_workers(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Leases were stamped and compared with each process's own clock: a worker on a machine
    whose clock ran an hour ahead saw every lease expired and took over jobs other workers
    were running (and one an hour behind held a dead worker's job for an hour). Claims and
    renewals now read the database's clock."""
    import rag.db.jobs as jobs_module

    emb = HashEmbedder()
    cid = _collection(db, emb)
    job_id = _upload(db, cid, "leased by the first worker")
    first = jobs.claim(db, "w1", lease_s=30)
    assert first is not None and first.id == job_id
    real = time.time
    monkeypatch.setattr(jobs_module, "now", lambda: real() + 3600)  # a clock an hour ahead
    monkeypatch.setattr(time, "time", lambda: real() + 3600)
    assert jobs.claim(db, "w2", lease_s=30) is None  # w1's lease still holds
    assert jobs.renew(db, first, 0.2)
    monkeypatch.setattr(jobs_module, "now", lambda: real() - 3600)  # an hour behind
    monkeypatch.setattr(time, "time", lambda: real() - 3600)
    time.sleep(0.3)
    taken = jobs.claim(db, "w3", lease_s=30)  # w1's short lease ran out on the database's clock
    assert taken is not None and taken.id == job_id and taken.owner == "w3"


def test_a_claim_stops_at_its_bytes_so_another_tenants_upload_waits_little(
    db: Database,
) -> None:
    """A claim is processed whole: one tenant's large files, taken 64 at a time, held the
    worker for minutes while another tenant's upload waited behind them. A claim now stops
    at claim_bytes of documents (one larger document alone), the tenants still taken in
    turn."""
    emb = HashEmbedder()
    flood, honest = _collection(db, emb, "flood"), _collection(db, emb, "honest")
    big = [_upload(db, flood, f"file {i} " + "filler words " * 8_000) for i in range(6)]
    small = _upload(db, honest, "the ferry leaves at nine")
    settings = IngestSettings(advanced=IngestAdvanced(claim_batch=64, claim_bytes=250_000))
    worker = Worker(db, Pipeline(db, emb, settings), settings)
    first = worker._claim_batch()
    assert [j.id for j in first] == [big[0], small, big[1]]  # ~104 KB each, then the budget
    assert [j.id for j in worker._claim_batch()] == [big[2], big[3]]
    huge = _upload(db, honest, "huge " * 60_000)  # larger than the budget: taken alone
    claims = [[j.id for j in worker._claim_batch()] for _ in range(3)]
    assert claims == [[huge], [big[4], big[5]], []]  # the tenant served longest ago first


def test_claims_take_turns_across_tenants_when_each_holds_one_job(db: Database) -> None:
    """A claim cut to one large document must not always start with the tenant whose oldest
    job is oldest: with a deep backlog that tenant would be served forever. The tenant served
    least recently goes first."""
    emb = HashEmbedder()
    flood, honest = _collection(db, emb, "flood"), _collection(db, emb, "honest")
    big = [_upload(db, flood, f"file {i} " + "filler words " * 8_000) for i in range(4)]
    settings = IngestSettings(advanced=IngestAdvanced(claim_batch=64, claim_bytes=50_000))
    worker = Worker(db, Pipeline(db, emb, settings), settings)
    assert [j.id for j in worker._claim_batch()] == [big[0]]
    small = _upload(db, honest, "the ferry leaves at nine")  # queued after the flood's
    assert [j.id for j in worker._claim_batch()] == [small]
    assert [j.id for j in worker._claim_batch()] == [big[1]]


def test_a_long_claim_pauses_for_another_tenants_upload(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A claim bounded in bytes can be minutes of the model's work (a megabyte of `[` is a
    million tokens), and an upload queued behind it used to wait for all of it. Between
    embedded slices the worker now runs the other tenants' due jobs first; the paused
    claim's vectors are the same as embedded in one call."""
    import ingest.worker as worker_module

    monkeypatch.setattr(worker_module, "PAUSE_AFTER_S", 0.0)
    order: list[str] = []

    class Recording(HashEmbedder):
        def embed(self, texts, deadline=None):  # type: ignore[no-untyped-def]
            if len(self.calls) == 0:  # the honest upload arrives during the long claim
                order.append("upload")
                uploaded.append(_upload(db, honest, "the ferry leaves at nine"))
            order.append("slice" if len(texts) > 1 else "honest")
            return super().embed(texts, deadline)

    emb = Recording()
    flood, honest = _collection(db, emb, "flood"), _collection(db, emb, "honest")
    uploaded: list[str] = []
    big = _upload(db, flood, " ".join(f"w{i}" for i in range(64 * 900)))  # ~1,000 chunks
    settings = IngestSettings(advanced=IngestAdvanced(lease_s=5, claim_batch=64))
    worker = Worker(db, Pipeline(db, emb, settings), settings)
    assert worker.run_once()
    assert order[:4] == ["upload", "slice", "honest", "slice"]  # served after one slice
    with db.read() as s:
        assert s.get(IngestJob, uploaded[0]).state == "done"  # type: ignore[union-attr]
        assert s.get(IngestJob, big).state == "done"  # type: ignore[union-attr]
        rows = s.execute(select(Chunk.text, Chunk.embedding).where(
            Chunk.document_id == s.get(IngestJob, big).document_id  # type: ignore[union-attr]
        )).all()  # fmt: skip
    texts = [r.text for r in rows]
    stored = np.vstack([np.frombuffer(r.embedding, np.float32) for r in rows])
    np.testing.assert_array_equal(stored, HashEmbedder().embed(texts))


def test_a_seeded_document_reads_as_an_ingested_one(db: Database) -> None:
    """Tests and benches write indexed documents through rag.db.seed, not the queue: the rows
    are the worker's own (chunks, their full-text rows, change-log entries, the document)."""
    from rag.db import fulltext, seed
    from rag.db.ingested import ChunkRow
    from rag.db.models import ChangeLog

    emb = HashEmbedder()
    ingested_cid, seeded_cid = _collection(db, emb, "a"), _collection(db, emb, "b")
    text = "the ferry leaves at nine " * 40
    _upload(db, ingested_cid, text)
    assert Worker(db, Pipeline(db, emb, SETTINGS), SETTINGS).run_once()

    def rows(cid: str) -> tuple[list[tuple[object, ...]], list[tuple[object, ...]]]:
        with db.read() as s:
            doc = s.scalars(select(Document).where(Document.collection_id == cid)).one()
            chunks = s.execute(
                select(Chunk.ordinal, Chunk.text, Chunk.start_char, Chunk.end_char,
                       Chunk.token_count, Chunk.embedding, Chunk.embedding_model)
                .where(Chunk.document_id == doc.id).order_by(Chunk.ordinal)
            ).all()  # fmt: skip
            logged = s.scalar(
                select(func.count()).select_from(ChangeLog).where(ChangeLog.collection_id == cid)
            )
            found = fulltext.keyword_search(s, cid, "ferry", 100)
            summary = (doc.status, doc.text, doc.chunk_count, logged, len(found))
        return [tuple(r) for r in chunks], [summary]

    chunks, _ = rows(ingested_cid)
    chunk_rows = [ChunkRow(o, t, a, b, n) for o, t, a, b, n, _, _ in chunks]
    vectors = emb.embed([r.text for r in chunk_rows])
    doc = seed.SeedDocument("t.txt", text.encode(), text, chunk_rows, vectors)
    [written] = seed.documents(db, seeded_cid, [doc], emb.model_id)
    assert len(written.chunk_ids) == len(chunk_rows) > 1
    assert rows(seeded_cid) == rows(ingested_cid)
