"""One contract every vector index backend must pass.

Kinds whose index lives outside the process (milvus, against `milvus-lite server`: see
tests/support/milvus.py) are bound to a Milvus collection of their own per test; what they
cannot support is declared below and skipped with the reason."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from rag.errors import Invalid
from rag.index import KINDS, Hits, Knobs, VectorIndex, build_index, index_class, load_index
from rag.index.exact import ExactIndex
from rag.index.filters import Where
from rag.index.milvus import MilvusIndex
from rag.index.params import Param
from tests.support.milvus import milvus_engine, milvus_uri  # noqa: F401  (fixtures)

DIM = 384


@pytest.fixture(params=KINDS)
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def new_index(kind: str, request: pytest.FixtureRequest) -> Iterator[Callable[..., VectorIndex]]:
    """A factory of empty indexes of `kind` (bound to a fresh Milvus collection for milvus,
    dropped after the test)."""
    made: list[VectorIndex] = []

    def make(params: dict[str, Any] | None = None) -> VectorIndex:
        index = build_index(kind, DIM, params)
        if isinstance(index, MilvusIndex):
            engine = request.getfixturevalue("milvus_engine")
            index.bind(engine, engine.new_name(uuid.uuid4().hex[:12]))
        made.append(index)
        return index

    yield make
    for index in made:
        if isinstance(index, MilvusIndex):
            index.drop()


def snapshots(kind: str) -> bool:
    """Whether the kind's index is saved to and loaded from files (milvus: it lives in
    Milvus, and the index manager never snapshots it)."""
    return index_class(kind).snapshots


NO_SNAPSHOT_FILES = "the index lives in its engine (Milvus): there are no snapshot files"


def unit(rng: np.random.Generator, n: int, dim: int = DIM) -> npt.NDArray[np.float32]:
    x = rng.standard_normal((n, dim)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def oracle(ids: npt.NDArray[np.int64], vectors: npt.NDArray[np.float32]) -> ExactIndex:
    index = ExactIndex(vectors.shape[1])
    index.add(ids, vectors)
    return index


def recall(results: list[Hits], truth: list[Hits], k: int) -> float:
    found = [
        len(set(r.ids.tolist()) & set(t.ids[:k].tolist()))
        for r, t in zip(results, truth, strict=True)
    ]
    return sum(found) / sum(min(k, len(t)) for t in truth)


def assert_well_formed(hits: list[Hits], n_queries: int, k: int) -> None:
    assert len(hits) == n_queries
    for h in hits:
        assert len(h) <= k
        assert h.ids.dtype == np.int64 and h.scores.dtype == np.float32
        assert (h.ids >= 0).all(), "padding leaked into results"
        assert len(set(h.ids.tolist())) == len(h), "a label returned twice"
        assert (np.diff(h.scores) <= 1e-5).all(), "not sorted best first"


def test_protocol(kind: str, new_index) -> None:
    index = new_index()
    assert isinstance(index, VectorIndex)
    assert index.kind == kind and index.dim == DIM


# Every trait VectorIndex declares, with the type its value has.
TRAITS = {
    "shared": bool,
    "snapshots": bool,
    "wants_attributes": bool,
    "filters_inside": bool,
    "param_schema": Mapping,
}
# Members every index answers, a no-op where the kind has nothing to do.
ANSWERS = {
    "effort_knob": (str, type(None)),
    "needs_retrain": bool,
    "deleted_count": int,
}


def test_declares_every_trait(kind: str) -> None:
    """A kind's class says what it is without being built (the API and the index manager
    read these before any index exists), and declares every trait the protocol names."""
    cls = index_class(kind)
    for name, kind_of in TRAITS.items():
        assert name in VectorIndex.__annotations__, f"the protocol lost {name}"
        assert hasattr(cls, name), f"{cls.__name__} does not declare {name}"
        assert isinstance(getattr(cls, name), kind_of), f"{cls.__name__}.{name}"
    assert all(isinstance(p, Param) for p in cls.param_schema.values())
    assert cls.kind == kind


def test_answers_every_member(kind: str, new_index) -> None:
    index = new_index()
    for name, kind_of in ANSWERS.items():
        assert isinstance(getattr(index, name), kind_of), f"{type(index).__name__}.{name}"
    assert index.effort_knob in (None, "ef_search", "nprobe")
    assert index.needs_retrain is False and index.deleted_count == 0  # empty
    for knob in (index.default_ef_search, index.default_nprobe, index.nprobe_max):
        assert isinstance(knob(), int) and knob() >= 0
    if index.effort_knob == "ef_search":
        assert index.default_ef_search() > 0
    if index.effort_knob == "nprobe":
        assert index.default_nprobe() > 0
    index.compact()  # a no-op where there is nothing to reclaim
    # Every index takes rows' attributes and a `where`; only one that filters inside its
    # engine acts on them (the others' callers resolve the filter to `allowed` ids).
    vectors = unit(np.random.default_rng(4), 3)
    index.add(np.array([1, 2, 3], dtype=np.int64), vectors, [("d1", {"team": "ops"})] * 3)
    hits = index.search(vectors[:1], Knobs(k=3), where=Where(document_ids=("d2",)))[0]
    assert len(hits) == (0 if index.filters_inside else 3)


def test_empty_index(kind: str, new_index) -> None:
    index = new_index()
    queries = unit(np.random.default_rng(0), 3)
    hits = index.search(queries, Knobs(k=10))
    assert [len(h) for h in hits] == [0, 0, 0]
    assert len(index) == 0
    assert index.remove(np.array([1, 2], dtype=np.int64)) == 0


def test_k_larger_than_count(kind: str, new_index) -> None:
    rng = np.random.default_rng(1)
    vectors = unit(rng, 5)
    ids = np.array([10, 20, 30, 40, 50], dtype=np.int64)
    index = new_index()
    index.add(ids, vectors)
    hits = index.search(vectors, Knobs(k=50))
    assert_well_formed(hits, 5, 50)
    for row, h in enumerate(hits):
        assert sorted(h.ids.tolist()) == ids.tolist()
        assert h.ids[0] == ids[row]
        np.testing.assert_allclose(h.scores, np.sort(vectors @ vectors[row])[::-1], atol=1e-5)


def test_search_after_delete(kind: str, new_index, minilm) -> None:
    ids, vectors = minilm.ids, minilm.corpus
    index = new_index()
    index.add(ids, vectors)
    gone = ids[::4]
    assert index.remove(gone) == len(gone)
    assert index.remove(gone) == 0  # already gone
    assert len(index) == len(ids) - len(gone)
    assert set(index.ids().tolist()) == set(ids.tolist()) - set(gone.tolist())
    # Query with the deleted vectors themselves: the best match would be the deleted label.
    gone_set = set(gone.tolist())
    for params in (Knobs(k=10), Knobs(k=10, exact=True), Knobs(k=1000)):
        hits = index.search(vectors[::4][:50], params)
        assert_well_formed(hits, 50, params.k)
        for h in hits:
            assert not gone_set & set(h.ids.tolist())
            assert len(h) == params.k
    keep = np.setdiff1d(ids, gone)
    index.remove(keep)
    assert len(index) == 0
    assert all(len(h) == 0 for h in index.search(vectors[:3], Knobs(k=5)))


def test_readd_replaces(kind: str, new_index) -> None:
    rng = np.random.default_rng(2)
    vectors = unit(rng, 300)
    ids = np.arange(300, dtype=np.int64)
    index = new_index()
    index.add(ids, vectors)
    replacement = unit(rng, 1)
    index.add(np.array([7], dtype=np.int64), replacement)
    assert len(index) == 300
    best = index.search(replacement, Knobs(k=1))[0]
    assert best.ids.tolist() == [7] and best.scores[0] == pytest.approx(1.0, abs=1e-4)
    old = index.search(vectors[7:8], Knobs(k=300))[0]
    assert dict(old)[7] == pytest.approx(float(vectors[7] @ replacement[0]), abs=1e-4)
    # Removed, then added again: live once more.
    index.remove(np.array([8], dtype=np.int64))
    index.add(np.array([8], dtype=np.int64), vectors[8:9])
    assert len(index) == 300
    assert index.search(vectors[8:9], Knobs(k=1))[0].ids.tolist() == [8]
    # A label twice in one batch keeps its last vector.
    index.add(np.array([9, 9], dtype=np.int64), np.vstack([vectors[1], replacement[0]]))
    assert index.search(replacement, Knobs(k=2))[0].ids.tolist() in ([7, 9], [9, 7])


def test_save_load_round_trip(kind: str, new_index, minilm, tmp_path: Path) -> None:
    if not snapshots(kind):
        pytest.skip(NO_SNAPSHOT_FILES)
    ids, vectors = minilm.ids, minilm.corpus
    index = new_index()
    index.add(ids, vectors)
    index.remove(ids[5:50])
    index.add(ids[:3], vectors[10:13])  # replaced vectors must survive the trip
    before = index.search(minilm.queries, Knobs(k=10))
    (tmp_path / "idx").mkdir()
    index.save(tmp_path / "idx")
    loaded = load_index(tmp_path / "idx")
    assert type(loaded) is type(index) and loaded.params == index.params
    assert len(loaded) == len(index)
    assert set(loaded.ids().tolist()) == set(index.ids().tolist())
    after = loaded.search(minilm.queries, Knobs(k=10))
    for a, b in zip(before, after, strict=True):
        assert a.ids.tolist() == b.ids.tolist()
        np.testing.assert_allclose(a.scores, b.scores, atol=1e-5)
    # Still a working index after loading.
    loaded.remove(ids[:1])
    loaded.add(ids[5:6], vectors[5:6])
    assert len(loaded) == len(index)
    assert loaded.search(vectors[5:6], Knobs(k=1))[0].ids.tolist() == [ids[5]]


# Backends that keep vectors as float32 in what they save (IVF-SQ8 keeps 8-bit codes).
RAW_VECTORS = {"exact", "hnsw", "faiss_flat", "faiss_ivf", "faiss_hnsw"}


def test_erase_leaves_no_copy_in_what_it_saves(
    kind: str, new_index, minilm, tmp_path: Path
) -> None:
    """A purged chunk's vector leaves the index for good: `erase` removes labels, live ones
    and ones already removed (which a backend may still hold as tombstones), so that no copy
    of their vectors is left in what `save` writes (nor, for a server, in its storage)."""
    ids, vectors = minilm.ids, minilm.corpus
    index = new_index()
    index.add(ids, vectors)
    index.remove(ids[:40])  # tombstoned first, as catch-up does at the delete
    gone = ids[:80]
    assert index.erase(gone) == 40  # the 40 still live
    assert index.erase(gone) == 0
    assert len(index) == len(ids) - 80
    for h in index.search(vectors[:80], Knobs(k=10, exact=True)):
        assert not set(gone.tolist()) & set(h.ids.tolist())
    if not snapshots(kind):
        # What the engine keeps on its disks is its own (Milvus deletes, then compacts).
        pytest.skip(f"erase checked in the engine; {NO_SNAPSHOT_FILES} to scan")
    (tmp_path / "idx").mkdir()
    index.save(tmp_path / "idx")
    saved = b"".join(p.read_bytes() for p in sorted((tmp_path / "idx").iterdir()))

    def window(row: int) -> bytes:
        return vectors[row].astype("<f4").tobytes()[:64]

    assert [row for row in range(80) if window(row) in saved] == []
    if kind in RAW_VECTORS:  # the search above means something: live vectors are there
        assert window(100) in saved
    loaded = load_index(tmp_path / "idx")
    assert len(loaded) == len(index)
    assert loaded.search(vectors[100:101], Knobs(k=1))[0].ids.tolist() == [ids[100]]


@pytest.mark.parametrize("path", ["in-search", "brute-force"])
def test_filter_inside_search(kind: str, new_index, path: str, minilm) -> None:
    ids, vectors = minilm.ids, minilm.corpus
    index = new_index()
    index.add(ids, vectors)
    if path == "in-search" and hasattr(index, "brute_force_max"):
        # Force the selector inside the ANN search instead of a scan of the allowed rows.
        index.brute_force_max = 0
    allowed = ids[::3]
    allowed_set = set(allowed.tolist())
    truth = oracle(allowed, vectors[::3]).search(minilm.queries, Knobs(k=10))
    hits = index.search(minilm.queries, Knobs(k=10), allowed=allowed_set)
    assert_well_formed(hits, len(minilm.queries), 10)
    for h in hits:
        assert set(h.ids.tolist()) <= allowed_set
        assert len(h) == 10
    assert recall(hits, truth, 10) >= 0.95
    # A tiny filter with an id that does not exist: exactly what is there.
    few = np.array([ids[0], ids[1], ids[2], 999], dtype=np.int64)
    for h in index.search(minilm.queries[:5], Knobs(k=10), allowed=few):
        assert sorted(h.ids.tolist()) == sorted(ids[:3].tolist())
    assert all(len(h) == 0 for h in index.search(minilm.queries[:2], Knobs(), allowed=[]))


def test_recall_at_10_default_knobs(kind: str, new_index, minilm) -> None:
    ids, vectors = minilm.ids, minilm.corpus
    index = new_index()
    index.add(ids, vectors)
    if kind.startswith("faiss_ivf"):
        assert index.is_trained  # type: ignore[attr-defined]
    truth = oracle(ids, vectors).search(minilm.queries, Knobs(k=10))
    hits = index.search(minilm.queries, Knobs(k=10))
    assert_well_formed(hits, len(minilm.queries), 10)
    assert recall(hits, truth, 10) >= 0.95
    exact = index.search(minilm.queries, Knobs(k=10, exact=True))
    assert recall(exact, truth, 10) >= (0.99 if kind != "faiss_ivf_sq8" else 0.97)


def test_concurrent_add_and_search(kind: str, new_index) -> None:
    rng = np.random.default_rng(3)
    vectors = unit(rng, 3000)
    ids = np.arange(3000, dtype=np.int64)
    index = new_index()
    index.add(ids[:1500], vectors[:1500])
    deleted = ids[:1500:3]
    index.remove(deleted)
    deleted_set = set(deleted.tolist())
    errors: list[BaseException] = []
    leaked: list[int] = []
    done = threading.Event()

    def writer() -> None:
        try:
            for start in range(1500, 3000, 100):
                index.add(ids[start : start + 100], vectors[start : start + 100])
                index.remove(ids[start : start + 10])  # churn among labels never deleted above
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)
        finally:
            done.set()

    def reader(seed: int) -> None:
        local = np.random.default_rng(seed)
        try:
            while not done.is_set():
                rows = local.integers(0, 1500, size=4)
                for h in index.search(vectors[rows], Knobs(k=20)):
                    leaked.extend(set(h.ids.tolist()) & deleted_set)
                allowed = ids[local.integers(0, 3000, size=50)]
                for h in index.search(vectors[rows], Knobs(k=5), allowed=allowed):
                    leaked.extend(set(h.ids.tolist()) & deleted_set)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=writer)] + [
        threading.Thread(target=reader, args=(seed,)) for seed in range(3)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors
    assert not leaked
    assert len(index) == 1500 - len(deleted) + 1500 - 150


def test_bad_input(kind: str, new_index) -> None:
    index = new_index()
    with pytest.raises(Invalid):
        index.add(np.array([1], dtype=np.int64), np.zeros((1, DIM + 1), np.float32))
    with pytest.raises(Invalid):
        index.add(np.array([1, 2], dtype=np.int64), np.zeros((1, DIM), np.float32))
    with pytest.raises(Invalid):
        index.search(np.zeros((1, 3), np.float32), Knobs())
    with pytest.raises(Invalid):
        Knobs(k=0)
    with pytest.raises(Invalid):
        build_index(kind, DIM, {"no_such_knob": 1})


def test_knobs_trade_recall(kind: str, new_index, minilm) -> None:
    ids, vectors = minilm.ids, minilm.corpus
    index = new_index()
    index.add(ids, vectors)
    truth = oracle(ids, vectors).search(minilm.queries, Knobs(k=10))
    if kind.startswith("faiss_ivf"):
        low, high = Knobs(k=10, nprobe=1), Knobs(k=10, nprobe=10_000)
    elif kind in ("hnsw", "faiss_hnsw", "milvus"):
        low, high = Knobs(k=10, ef_search=10), Knobs(k=10, ef_search=400)
    else:
        pytest.skip("exact kinds have no recall knob")
    r_low = recall(index.search(minilm.queries, low), truth, 10)
    r_high = recall(index.search(minilm.queries, high), truth, 10)
    assert r_low <= r_high and r_high >= 0.97
    if kind.startswith("faiss_ivf"):
        assert r_low < 0.9  # one list out of dozens misses most neighbours
