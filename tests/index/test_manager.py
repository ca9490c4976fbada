"""IndexManager against a real SQLite file: build, catch up, snapshot, refuse, rebuild."""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from sqlalchemy import update

from rag.db.models import Chunk, Collection
from rag.db.session import Database
from rag.errors import Invalid, NotFound
from rag.index import Knobs
from rag.index.manager import IndexManager
from rag.index.snapshot import SnapshotStore

# The seeder fixture (tests/index/conftest.py) writes with this model and dimension.
MODEL = "test-model"
DIM = 16
Seeder = Any


@pytest.fixture
def manager(db: Database, tmp_path: Path):
    m = IndexManager(db, tmp_path / "data", MODEL, DIM)
    yield m
    m.close()


def top1(manager: IndexManager, collection_id: str, vectors: np.ndarray) -> list[int]:
    outcome = manager.search(collection_id, vectors, Knobs(k=1))
    return [int(h.ids[0]) if len(h) else -1 for h in outcome.hits]


def all_ids(manager: IndexManager, collection_id: str) -> set[int]:
    manager.catch_up(collection_id)
    return set(manager.get(collection_id).ids().tolist())


def test_builds_from_sql_then_catches_up(manager: IndexManager, seeder: Seeder) -> None:
    cid = seeder.collection()
    _, ids1, vec1 = seeder.document(cid, 20)
    doc2, ids2, vec2 = seeder.document(cid, 20)
    assert top1(manager, cid, vec1[:5]) == ids1[:5]
    state = manager.state(cid)
    assert state.count == 40 and state.kind == "faiss_flat" and state.generation is None

    # Ingested after the index opened: searchable on the next search, no restart.
    _, ids3, vec3 = seeder.document(cid, 10)
    assert top1(manager, cid, vec3) == ids3
    # A deleted document is gone from the next search.
    seeder.delete_document(doc2)
    hits = manager.search(cid, vec2, Knobs(k=50)).hits
    assert all(not set(h.ids.tolist()) & set(ids2) for h in hits)
    state = manager.state(cid)
    assert state.count == 30 and not state.stale
    assert all_ids(manager, cid) == set(ids1) | set(ids3)


def test_catch_up_is_cheap_when_nothing_changed(
    manager: IndexManager, seeder: Seeder, db: Database
) -> None:
    cid = seeder.collection()
    seeder.document(cid, 5)
    manager.get(cid)
    statements: list[str] = []

    def record(conn, cursor, statement, *args) -> None:  # type: ignore[no-untyped-def]
        statements.append(statement)

    from sqlalchemy import event

    event.listen(db.engine, "before_cursor_execute", record)
    try:
        assert manager.catch_up(cid) == 0
    finally:
        event.remove(db.engine, "before_cursor_execute", record)
    queries = [s for s in statements if s.lstrip().upper().startswith("SELECT")]
    assert len(queries) == 1 and "change_log" in queries[0]


def test_tombstoned_document_skipped_without_remove_rows(
    manager: IndexManager, seeder: Seeder
) -> None:
    cid = seeder.collection()
    _, ids1, _ = seeder.document(cid, 5)
    doc2, ids2, vec2 = seeder.document(cid, 5)
    # Tombstoned, its "remove" rows not written yet: the "add" rows must not resurrect it.
    seeder.delete_document(doc2, log_removes=False)
    assert all_ids(manager, cid) == set(ids1)
    # Replaying the change log from the start (a rebuild) does not resurrect it either.
    _, ids3, _ = seeder.document(cid, 5)
    manager.rebuild(cid).result(timeout=30)
    assert all_ids(manager, cid) == set(ids1) | set(ids3)
    fresh = IndexManager(manager.db, manager.data_dir / "other", MODEL, DIM)
    try:
        assert all_ids(fresh, cid) == set(ids1) | set(ids3)
    finally:
        fresh.close()


def test_chunk_removed_by_change_log(manager: IndexManager, seeder: Seeder, db: Database) -> None:
    cid = seeder.collection()
    doc, ids, vectors = seeder.document(cid, 6)
    manager.get(cid)
    from rag.db.models import ChangeLog

    with db.write() as s:
        s.add(ChangeLog(collection_id=cid, op="remove", chunk_id=ids[0], document_id=doc))
        s.add(ChangeLog(collection_id=cid, op="remove", chunk_id=ids[1], document_id=doc))
        s.add(ChangeLog(collection_id=cid, op="add", chunk_id=ids[1], document_id=doc))
    assert manager.catch_up(cid) == 3
    assert all_ids(manager, cid) == set(ids[1:])


def test_restart_loads_snapshot_and_catches_up(
    db: Database, seeder: Seeder, tmp_path: Path
) -> None:
    cid = seeder.collection(kind="hnsw")
    _, ids1, vec1 = seeder.document(cid, 30)
    first = IndexManager(db, tmp_path / "data", MODEL, DIM)
    manifest = first.snapshot(cid)
    assert manifest.generation == 1 and manifest.count == 30 and manifest.kind == "hnsw"
    first.close()
    doc2, ids2, vec2 = seeder.document(cid, 10)
    seeder.delete_document(doc2)
    _, ids3, vec3 = seeder.document(cid, 10)

    restarted = IndexManager(db, tmp_path / "data", MODEL, DIM)
    try:
        state = restarted.state(cid)
        assert state.generation == 1 and state.kind == "hnsw"
        assert state.watermark > manifest.watermark
        assert all_ids(restarted, cid) == set(ids1) | set(ids3)
        assert top1(restarted, cid, vec3) == ids3
    finally:
        restarted.close()


def test_bit_flipped_snapshot_is_refused_and_rebuilt_from_sql(
    db: Database, seeder: Seeder, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cid = seeder.collection(kind="faiss_hnsw")
    _, ids, vectors = seeder.document(cid, 40)
    first = IndexManager(db, tmp_path / "data", MODEL, DIM)
    first.snapshot(cid)
    first.close()
    path = SnapshotStore(tmp_path / "data", cid).path_of(1) / "index.faiss"
    data = bytearray(path.read_bytes())
    data[len(data) // 3] ^= 0x01
    path.write_bytes(bytes(data))

    restarted = IndexManager(db, tmp_path / "data", MODEL, DIM)
    try:
        with caplog.at_level(logging.WARNING):
            state = restarted.state(cid)
        # Never a silently empty index: the SQL rows are served.
        assert state.count == 40 and state.generation is None and state.kind == "faiss_hnsw"
        assert top1(restarted, cid, vectors) == ids
        messages = " ".join(r.getMessage() for r in caplog.records)
        assert "refused" in messages and "rebuilding from SQL" in messages
        # The next snapshot is a valid generation again.
        assert restarted.snapshot(cid).generation == 2
    finally:
        restarted.close()


def test_corrupt_newest_generation_falls_back_to_previous(
    db: Database, seeder: Seeder, tmp_path: Path
) -> None:
    cid = seeder.collection(kind="exact")
    _, ids1, _ = seeder.document(cid, 10)
    m = IndexManager(db, tmp_path / "data", MODEL, DIM)
    m.snapshot(cid)
    _, ids2, _ = seeder.document(cid, 10)
    m.snapshot(cid)
    m.close()
    (SnapshotStore(tmp_path / "data", cid).path_of(2) / "vectors.npy").write_bytes(b"garbage")
    restarted = IndexManager(db, tmp_path / "data", MODEL, DIM)
    try:
        assert restarted.state(cid).generation == 1
        assert all_ids(restarted, cid) == set(ids1) | set(ids2)  # caught up past gen 1
    finally:
        restarted.close()


def test_snapshot_of_another_embedding_model_is_refused(
    db: Database, seeder: Seeder, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cid = seeder.collection(kind="exact")
    _, ids, vectors = seeder.document(cid, 10)
    old = IndexManager(db, tmp_path / "data", MODEL, DIM)
    old.snapshot(cid)
    old.close()
    # The collection is re-embedded with another model (same dimension).
    with db.write() as s:
        s.execute(update(Collection).where(Collection.id == cid).values(embedding_model="v2"))
        s.execute(update(Chunk).where(Chunk.collection_id == cid).values(embedding_model="v2"))
    new = IndexManager(db, tmp_path / "data", "v2", DIM)
    try:
        with caplog.at_level(logging.WARNING):
            state = new.state(cid)
        assert state.generation is None and state.count == 10
        assert any("refused" in r.getMessage() for r in caplog.records)
    finally:
        new.close()
    # A manager for the old model cannot open the collection at all now.
    stale = IndexManager(db, tmp_path / "data", MODEL, DIM)
    with pytest.raises(Invalid):
        stale.get(cid)
    stale.close()


def test_unknown_collection(manager: IndexManager) -> None:
    with pytest.raises(NotFound):
        manager.get("nope")


def test_rebuild_swaps_kind_atomically_under_search(manager: IndexManager, seeder: Seeder) -> None:
    cid = seeder.collection()
    _, ids, vectors = seeder.document(cid, 300)
    assert manager.state(cid).kind == "faiss_flat"
    errors: list[BaseException] = []
    counts: list[int] = []
    stop = threading.Event()

    def searcher() -> None:
        try:
            while not stop.is_set():
                hits = manager.search(cid, vectors[:3], Knobs(k=5)).hits
                counts.append(min(len(h) for h in hits))
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=searcher) for _ in range(2)]
    for t in threads:
        t.start()
    try:
        state = manager.rebuild(cid, kind="hnsw", params={"m": 8}).result(timeout=60)
        _, ids2, vec2 = seeder.document(cid, 5)  # changes after the swap still arrive
        assert top1(manager, cid, vec2) == ids2
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert not errors, errors
    assert counts and min(counts) == 5  # never an empty or half-built index
    assert state.kind == "hnsw" and state.count == 300 and not state.building
    assert manager.state(cid).generation is not None  # the rebuild wrote a snapshot
    with pytest.raises(Invalid):
        manager.rebuild(cid, kind="no-such-kind")


def test_second_process_sees_new_chunks(db: Database, seeder: Seeder, tmp_path: Path) -> None:
    # Two managers stand in for two API replicas sharing one database.
    cid = seeder.collection()
    seeder.document(cid, 5)
    a = IndexManager(db, tmp_path / "a", MODEL, DIM)
    b = IndexManager(Database(str(db.url)), tmp_path / "b", MODEL, DIM)
    try:
        a.get(cid), b.get(cid)
        _, ids, vectors = seeder.document(cid, 5)
        assert top1(a, cid, vectors) == ids
        assert top1(b, cid, vectors) == ids
    finally:
        a.close()
        b.close()


def test_replicas_follow_the_kind_the_collection_declares(
    db: Database, seeder: Seeder, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`rag index rebuild --kind` in one process (or another replica) changes the row; every
    other replica notices and rebuilds itself from SQL."""
    import rag.index.maintenance as manager_module

    monkeypatch.setattr(manager_module, "SPEC_CHECK_S", 0.0)
    cid = seeder.collection()
    _, ids, vectors = seeder.document(cid, 8)
    replica = IndexManager(db, tmp_path / "replica", MODEL, DIM)
    try:
        assert replica.get(cid).kind == "faiss_flat"
        replica.start(interval_s=0.05)
        with db.write() as s:
            row = s.get(Collection, cid)
            assert row is not None
            row.index_kind, row.index_params = "hnsw", {"m": 8}
        deadline = time.monotonic() + 10
        while replica.get(cid).kind != "hnsw":
            assert time.monotonic() < deadline, "the replica never rebuilt"
            time.sleep(0.05)
        assert replica.get(cid).params["m"] == 8
        assert top1(replica, cid, vectors) == ids
    finally:
        replica.close()


def test_background_catch_up_within_a_second(manager: IndexManager, seeder: Seeder) -> None:
    cid = seeder.collection()
    seeder.document(cid, 5)
    manager.get(cid)
    manager.start(interval_s=0.1)
    _, ids, _ = seeder.document(cid, 5)
    committed = time.monotonic()
    while not set(ids) <= set(manager.get(cid).ids().tolist()):
        assert time.monotonic() - committed < 1.0, "not searchable within a second"
        time.sleep(0.02)


def test_deleted_documents_never_returned_under_concurrent_search(
    manager: IndexManager, seeder: Seeder
) -> None:
    cid = seeder.collection()
    docs = [seeder.document(cid, 10) for _ in range(6)]
    probe = np.vstack([d[2] for d in docs])
    manager.get(cid)
    deleted: set[int] = set()
    deleted_lock = threading.Lock()
    leaked: list[int] = []
    errors: list[BaseException] = []
    stop = threading.Event()

    def searcher() -> None:
        try:
            while not stop.is_set():
                with deleted_lock:
                    gone_before = set(deleted)  # committed before this search began
                for h in manager.search(cid, probe, Knobs(k=10)).hits:
                    leaked.extend(gone_before & set(h.ids.tolist()))
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=searcher) for _ in range(3)]
    for t in threads:
        t.start()
    try:
        for doc_id, ids, _ in docs[:4]:
            seeder.document(cid, 3)
            seeder.delete_document(doc_id)
            with deleted_lock:
                deleted.update(ids)
            time.sleep(0.02)
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert not errors, errors
    assert not leaked


def test_search_filter_and_state(manager: IndexManager, seeder: Seeder) -> None:
    cid = seeder.collection(kind="hnsw")
    _, ids1, vec1 = seeder.document(cid, 10)
    _, ids2, _ = seeder.document(cid, 10)
    outcome = manager.search(cid, vec1[:2], Knobs(k=5), allowed_ids=ids2)
    assert all(set(h.ids.tolist()) <= set(ids2) and len(h) == 5 for h in outcome.hits)
    assert outcome.state.kind == "hnsw" and outcome.state.count == 20
    assert not outcome.state.building and not outcome.state.stale


def test_purge_removes_what_a_crashed_snapshot_writer_left(
    manager: IndexManager, seeder: Seeder, tmp_path: Path
) -> None:
    """A half-written generation (a writer killed mid-save) may hold vectors a delete has
    removed since: one untouched for 5 minutes goes; one being written stays."""
    import os

    from rag.index import snapshot

    cid = seeder.collection()
    seeder.document(cid, 3)
    root = tmp_path / "data" / "indexes" / cid
    dead, busy = root / ".tmp-dead", root / ".tmp-busy"
    for tmp in (dead, busy):
        tmp.mkdir(parents=True)
        (tmp / "index.faiss").write_bytes(b"vectors")
    old = time.time() - snapshot.ABANDONED_S - 60
    for path in (dead, dead / "index.faiss"):
        os.utime(path, (old, old))
    manager.purge()
    assert not dead.exists() and busy.exists()


def test_erase_never_drops_a_live_id(manager: IndexManager, seeder: Seeder, db: Database) -> None:
    """A "remove" entry for an id that is live again (SQLite reused ids before 0008): the
    purge erases what catch-up removed, never a chunk SQL still holds."""
    cid = seeder.collection()
    doc, ids, _ = seeder.document(cid, 4)
    manager.get(cid)
    from rag.db.models import ChangeLog

    with db.write() as s:
        s.add(ChangeLog(collection_id=cid, op="remove", chunk_id=ids[0], document_id="gone"))
        s.add(ChangeLog(collection_id=cid, op="add", chunk_id=ids[0], document_id=doc))
    manager.purge()
    assert all_ids(manager, cid) == set(ids)


def test_check_finds_and_repair_fixes_what_the_index_lost(
    manager: IndexManager, seeder: Seeder, db: Database
) -> None:
    cid = seeder.collection(kind="hnsw")
    _, ids, vecs = seeder.document(cid, 6)
    assert manager.check(cid).ok
    index = manager.get(cid)
    index.erase(np.array(ids[:2], dtype=np.int64))  # lost, as the id reuse lost them
    index.add(np.array([999], dtype=np.int64), vecs[:1])  # a vector SQL does not hold
    found = manager.check(cid)
    assert (found.missing, found.extra, found.index_count, found.sql_count) == (2, 1, 5, 6)
    assert found.missing_sample == tuple(ids[:2]) and found.extra_sample == (999,)
    assert not manager.repair(cid).ok
    assert manager.check(cid).ok and all_ids(manager, cid) == set(ids)
    assert top1(manager, cid, vecs[:2]) == ids[:2]
    # The repair was written down: a process that opens the snapshot has it too.
    fresh = IndexManager(db, manager.data_dir, MODEL, DIM)
    try:
        assert fresh.state(cid).generation is not None and all_ids(fresh, cid) == set(ids)
    finally:
        fresh.close()


def test_the_loop_repairs_a_count_that_differs_and_reports_it(
    manager: IndexManager, seeder: Seeder
) -> None:
    cid = seeder.collection()
    _, ids, _ = seeder.document(cid, 5)
    manager.get(cid).erase(np.array(ids[:1], dtype=np.int64))
    manager.check_counts()
    live = dict(manager.lives())[cid]
    assert live.mismatch == 1 and all_ids(manager, cid) == set(ids)
    manager.check_counts()
    assert live.mismatch == 0


def test_reused_ids_are_checked_at_start(
    manager: IndexManager, seeder: Seeder, db: Database
) -> None:
    """A snapshot written while an id was reused (before 0008) lacks the live chunk: the
    start-up check of an install with reused ids puts it back."""
    cid = seeder.collection()
    _, ids, _ = seeder.document(cid, 3)
    manager.get(cid).erase(np.array(ids[:1], dtype=np.int64))
    manager.snapshot(cid)
    from rag.db.models import ChangeLog

    with db.write() as s:
        s.add(ChangeLog(collection_id=cid, op="remove", chunk_id=ids[0], document_id="gone"))
    fresh = IndexManager(db, manager.data_dir, MODEL, DIM)
    try:
        fresh.check_reused()
        assert all_ids(fresh, cid) == set(ids)
    finally:
        fresh.close()
