"""IndexManager with collections of kind milvus, against `milvus-lite server` and a real
database: built from SQL into Milvus, caught up by one writer, shared by replicas, rebuilt into
a new Milvus collection swapped in by name, dropped with the collection."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

from rag.config import MilvusSettings
from rag.db import milvus_collections as bindings
from rag.db.models import Base, Collection
from rag.db.session import Database
from rag.errors import Invalid
from rag.index import Knobs
from rag.index.filters import Where
from rag.index.manager import IndexManager
from rag.index.milvus import MilvusEngine
from tests.index.conftest import DIM, MODEL, Seeder
from tests.support.milvus import milvus_uri  # noqa: F401  (fixture)


@pytest.fixture
def settings(milvus_uri: str) -> MilvusSettings:  # noqa: F811
    # A prefix of its own: tests share one server, and a test's leftovers stay its own.
    return MilvusSettings(uri=milvus_uri, collection_prefix=f"t{uuid.uuid4().hex[:10]}")


@pytest.fixture
def replicas(
    db: Database, tmp_path: Path, settings: MilvusSettings
) -> Iterator[Callable[[], IndexManager]]:
    made: list[IndexManager] = []

    def make() -> IndexManager:
        m = IndexManager(db, tmp_path / f"r{len(made)}", MODEL, DIM, milvus=settings)
        made.append(m)
        return m

    yield make
    for m in made:
        m.close()


def engine_names(settings: MilvusSettings) -> list[str]:
    engine = MilvusEngine(settings)
    try:
        return engine.names()
    finally:
        engine.close()


def top1(manager: IndexManager, cid: str, vectors: np.ndarray) -> list[int]:
    hits = manager.search(cid, vectors, Knobs(k=1)).hits
    return [int(h.ids[0]) if len(h) else -1 for h in hits]


def binding(db: Database, cid: str) -> bindings.Binding | None:
    with db.read() as session:
        return bindings.get(session, cid)


def test_built_from_sql_then_caught_up(replicas, seeder: Seeder, db: Database, settings) -> None:
    cid = seeder.collection(kind="milvus")
    _, ids1, vec1 = seeder.document(cid, 30)
    manager = replicas()
    assert top1(manager, cid, vec1[:5]) == ids1[:5]
    state = manager.state(cid)
    assert state.kind == "milvus" and state.count == 30 and state.generation is None
    bound = binding(db, cid)
    assert bound is not None and bound.name in engine_names(settings)
    assert bound.watermark == state.watermark and bound.building is None

    # Ingested after the index opened: searchable on the next search.
    doc2, ids2, vec2 = seeder.document(cid, 10)
    assert top1(manager, cid, vec2) == ids2
    # Deleted: gone from the next search, and from Milvus.
    seeder.delete_document(doc2)
    hits = manager.search(cid, vec2, Knobs(k=50)).hits
    assert all(not set(h.ids.tolist()) & set(ids2) for h in hits)
    assert set(manager.get(cid).ids().tolist()) == set(ids1)
    assert binding(db, cid).watermark == manager.state(cid).watermark  # type: ignore[union-attr]


def test_no_snapshots(replicas, seeder: Seeder, tmp_path: Path) -> None:
    cid = seeder.collection(kind="milvus")
    seeder.document(cid, 5)
    manager = replicas()
    manager.get(cid)
    with pytest.raises(Invalid, match="no snapshots"):
        manager.snapshot(cid)
    assert not (tmp_path / "r0" / "indexes" / cid).exists()


def test_replicas_share_one_copy_and_one_writer(replicas, seeder: Seeder, db: Database) -> None:
    cid = seeder.collection(kind="milvus")
    _, ids1, vec1 = seeder.document(cid, 20)
    a, b = replicas(), replicas()
    assert top1(a, cid, vec1[:3]) == ids1[:3]
    assert top1(b, cid, vec1[:3]) == ids1[:3]
    assert binding(db, cid).name == a.get(cid).name == b.get(cid).name  # type: ignore[attr-defined, union-attr]
    # Changes after both opened: applied once, by whichever replica catches up first.
    _, ids2, vec2 = seeder.document(cid, 15)
    applied = [0, 0]

    def catch(i: int, m: IndexManager) -> None:
        applied[i] = m.catch_up(cid)

    threads = [threading.Thread(target=catch, args=(i, m)) for i, m in enumerate((a, b))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert sum(applied) == 15
    assert top1(b, cid, vec2) == ids2 and top1(a, cid, vec2) == ids2
    assert a.state(cid).watermark == b.state(cid).watermark == binding(db, cid).watermark  # type: ignore[union-attr]


def test_rebuild_swaps_a_new_collection_in_everywhere(
    replicas, seeder: Seeder, db: Database, settings: MilvusSettings
) -> None:
    cid = seeder.collection(kind="milvus")
    _, ids1, vec1 = seeder.document(cid, 25)
    a, b = replicas(), replicas()
    assert top1(b, cid, vec1[:2]) == ids1[:2]
    old = binding(db, cid).name  # type: ignore[union-attr]
    state = a.rebuild(cid, "milvus", {"index_type": "IVF_FLAT", "nlist": 4}).result(timeout=120)
    assert state.kind == "milvus" and state.count == 25
    new = binding(db, cid)
    assert new is not None and new.name != old and new.params["index_type"] == "IVF_FLAT"
    assert engine_names(settings) == [new.name]  # the old one was dropped
    # Replica b still holds the old name: its next search follows the swap.
    assert top1(b, cid, vec1[:4]) == ids1[:4]
    assert b.get(cid).params["index_type"] == "IVF_FLAT"


def test_maintenance_rebuild_adopts_what_another_replica_built(
    replicas, seeder: Seeder, db: Database
) -> None:
    cid = seeder.collection(kind="milvus")
    seeder.document(cid, 5)
    a, b = replicas(), replicas()
    a.get(cid)
    b.get(cid)
    a.rebuild(cid, "milvus", {"m": 8}).result(timeout=120)
    swapped = binding(db, cid).name  # type: ignore[union-attr]
    with db.write() as s:
        row = s.get(Collection, cid)
        assert row is not None
        row.index_params = {"m": 8}
    # The maintenance loop's rebuild (no kind given) adopts it instead of building again.
    b.rebuild(cid).result(timeout=120)
    assert binding(db, cid).name == swapped == b.get(cid).name  # type: ignore[attr-defined, union-attr]


def test_filters_pushed_into_milvus(replicas, seeder: Seeder, db: Database) -> None:
    cid = seeder.collection(kind="milvus")
    doc1, ids1, vec1 = seeder.document(cid, 10)
    doc2, ids2, _ = seeder.document(cid, 10)
    manager = replicas()
    assert manager.filters_inside(cid)
    hits = manager.search(cid, vec1[:3], Knobs(k=5), where=Where(document_ids=(doc2,))).hits
    for h in hits:
        assert len(h) == 5 and set(h.ids.tolist()) <= set(ids2)
    # An id list resolved in SQL (the hybrid path) is honoured too.
    hits = manager.search(cid, vec1[:3], Knobs(k=5), allowed_ids=set(ids1[:2])).hits
    assert all(sorted(h.ids.tolist()) == sorted(ids1[:2]) for h in hits)


def test_drop_and_sweep(replicas, seeder: Seeder, db: Database, settings) -> None:
    cid = seeder.collection(kind="milvus")
    other = seeder.collection(kind="milvus")
    seeder.document(cid, 5)
    seeder.document(other, 5)
    manager = replicas()
    manager.get(cid)
    manager.get(other)
    assert len(engine_names(settings)) == 2
    manager.drop(cid)
    assert binding(db, cid) is None and len(engine_names(settings)) == 1
    # Deleted elsewhere (another replica, a purge): the sweep drops its Milvus collection.
    with db.write() as s:
        row = s.get(Collection, other)
        assert row is not None
        row.deleted_at = 1.0
    assert manager.sweep_shared() == 1
    assert engine_names(settings) == [] and binding(db, other) is None


def test_kind_milvus_without_a_server_is_refused(db: Database, seeder: Seeder, tmp_path) -> None:
    cid = seeder.collection(kind="milvus")
    manager = IndexManager(db, tmp_path / "x", MODEL, DIM)
    try:
        with pytest.raises(Invalid, match="RAG_MILVUS__URI"):
            manager.get(cid)
    finally:
        manager.close()


@pytest.mark.pg
def test_one_writer_on_postgresql(pg_url: str) -> None:
    db = Database(pg_url)
    Base.metadata.create_all(db.engine)
    try:
        held: list[bool] = []
        inside = threading.Event()
        release = threading.Event()

        def first() -> None:
            with bindings.writer(db, "c1", wait=False) as w:
                held.append(w.held)
                inside.set()
                release.wait(10)

        t = threading.Thread(target=first)
        t.start()
        assert inside.wait(10)
        with bindings.writer(db, "c1", wait=False) as w:
            held.append(w.held)
        with bindings.writer(db, "c2", wait=False) as w:  # another collection: its own lock
            held.append(w.held)
        release.set()
        t.join(10)
        with bindings.writer(db, "c1", wait=False) as w:  # released with its transaction
            held.append(w.held)
        assert held == [True, False, True, True]
    finally:
        db.dispose()
