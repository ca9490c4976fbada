"""FAISS backends: Flat, IVF-Flat, IVF-SQ8 and HNSW, inner product on unit vectors.

Quirks hidden here: faiss pads missing results with -1 (dropped); IVF needs training (it serves
from a flat staging index until `min_train` vectors exist, and a rebuild retrains with the data
it has then); faiss HNSW cannot remove (labels are tombstoned and filtered out inside the search
with an ID bitmap); searching while adding is unsafe (a readers-writer lock guards each index).
When faiss sees a GPU, Flat and IVF searches without a filter run on a GPU replica of the CPU
index; the CPU index stays the one that is mutated and saved.
"""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import faiss as _faiss
import numpy as np
import numpy.typing as npt

from rag.index.base import (
    Allowed,
    Hits,
    Ids,
    RWLock,
    SearchParams,
    Vectors,
    allowed_array,
    as_ids,
    as_vectors,
    auto_ef_search,
    brute_force,
    check_add,
    read_meta,
    unpad,
    write_meta,
)

log = logging.getLogger(__name__)

# faiss's SWIG type stubs miss most of its Python API; treat the module as untyped.
faiss: Any = _faiss

INDEX_FILE = "index.faiss"
# Below this many allowed labels a filtered search scans their vectors exactly.
BRUTE_FORCE_MAX = 2048


# Searches of at most this many queries (a request's one) run on the calling thread alone.
FEW_QUERIES = 4

_Search = TypeVar("_Search", bound=Callable[..., list[Hits]])


def _one_thread_for_few(search: _Search) -> _Search:
    """Run a search of a few queries without an OpenMP team.

    faiss parallelises a search over its queries; for a request's single query that buys
    nothing, and the team's threads then spin for a while (libgomp's default wait policy),
    on the cores the next request needs to embed its query. On 2 cores, `/search` at 5k
    chunks (a flat index) took 14.0 ms at the median with the team and 8.7 ms without.
    OpenMP's thread count is per calling thread: builds and big batches keep every core.
    """

    @functools.wraps(search)
    def wrapper(self: Any, queries: Any, *args: Any, **kwargs: Any) -> list[Hits]:
        few = getattr(queries, "ndim", 2) != 2 or len(queries) <= FEW_QUERIES
        threads = faiss.omp_get_max_threads() if few else 1
        if threads == 1:
            return search(self, queries, *args, **kwargs)
        faiss.omp_set_num_threads(1)
        try:
            return search(self, queries, *args, **kwargs)
        finally:
            faiss.omp_set_num_threads(threads)

    return wrapper  # type: ignore[return-value]


def gpu_available() -> bool:
    return hasattr(faiss, "StandardGpuResources") and faiss.get_num_gpus() > 0


class _GpuReplica:
    """A lazily refreshed GPU copy of a CPU index, for unfiltered searches."""

    def __init__(self) -> None:
        self._resources: Any = None
        self._index: Any = None
        self.enabled = gpu_available()

    def invalidate(self) -> None:
        self._index = None

    def get(self, cpu_index: Any) -> Any:
        if not self.enabled:
            return None
        if self._index is None:
            try:
                if self._resources is None:
                    self._resources = faiss.StandardGpuResources()
                self._index = faiss.index_cpu_to_gpu(self._resources, 0, cpu_index)
            except Exception:  # a GPU that fails once is not retried: CPU still answers
                log.warning("faiss GPU replica failed; searching on CPU", exc_info=True)
                self.enabled = False
                return None
        return self._index


class _FaissBase:
    kind = ""

    def __init__(self, dim: int) -> None:
        self.dim = dim
        # Live labels (faiss HNSW keeps its label -> slot dict here instead).
        self._live: Any = set()
        self._lock = RWLock()

    def __len__(self) -> int:
        return len(self._live)

    def ids(self) -> Ids:
        with self._lock.read():
            return np.fromiter(self._live, dtype=np.int64, count=len(self._live))

    def _present(self, ids: Ids) -> Ids:
        return np.array([i for i in ids.tolist() if i in self._live], dtype=np.int64)

    def _allowed_live(self, allowed: Allowed) -> Ids:
        labels = allowed_array(allowed)
        return np.array([i for i in labels.tolist() if i in self._live], dtype=np.int64)

    @staticmethod
    def _empty(n: int) -> list[Hits]:
        return [Hits() for _ in range(n)]


class FaissFlatIndex(_FaissBase):
    """Exact search; `remove_ids` compacts the storage."""

    kind = "faiss_flat"

    def __init__(self, dim: int, *, use_gpu: bool = True) -> None:
        super().__init__(dim)
        self.use_gpu = use_gpu
        self._index = faiss.IndexIDMap2(faiss.IndexFlatIP(dim))
        self._gpu = _GpuReplica()
        self._gpu.enabled = self._gpu.enabled and use_gpu

    @property
    def params(self) -> dict[str, Any]:
        return {"use_gpu": self.use_gpu}

    def add(self, ids: Ids, vectors: Vectors) -> None:
        ids, vectors = check_add(ids, vectors, self.dim)
        if not len(ids):
            return
        with self._lock.write():
            existing = self._present(ids)
            if len(existing):
                self._index.remove_ids(faiss.IDSelectorBatch(existing))
            self._index.add_with_ids(vectors, ids)
            self._live.update(ids.tolist())
            self._gpu.invalidate()

    def remove(self, ids: Ids) -> int:
        with self._lock.write():
            existing = self._present(as_ids(ids))
            if len(existing):
                self._index.remove_ids(faiss.IDSelectorBatch(existing))
                self._live.difference_update(existing.tolist())
                self._gpu.invalidate()
            return len(existing)

    @_one_thread_for_few
    def search(
        self, queries: Vectors, params: SearchParams, allowed: Allowed | None = None
    ) -> list[Hits]:
        queries = as_vectors(queries, self.dim)
        with self._lock.read():
            if allowed is None:
                k = min(params.k, len(self._live))
                if k == 0:
                    return self._empty(len(queries))
                gpu = self._gpu.get(self._index)
                scores, labels = (gpu or self._index).search(queries, k)
                return unpad(scores, labels)
            subset = self._allowed_live(allowed)
            k = min(params.k, len(subset))
            if k == 0:
                return self._empty(len(queries))
            sel = faiss.IDSelectorBatch(subset)
            scores, labels = self._index.search(queries, k, params=faiss.SearchParameters(sel=sel))
            return unpad(scores, labels)

    def save(self, path: Path) -> None:
        with self._lock.read():
            faiss.write_index(self._index, str(path / INDEX_FILE))
            write_meta(path, self.kind, self.dim, self.params, count=len(self._live))

    @classmethod
    def load(cls, path: Path) -> FaissFlatIndex:
        meta = read_meta(path, cls.kind)
        index = cls(int(meta["dim"]), **meta["params"])
        index._index = faiss.read_index(str(path / INDEX_FILE))
        index._live = set(faiss.vector_to_array(index._index.id_map).tolist())
        return index


class FaissIVFIndex(_FaissBase):
    """IVF-Flat. Until `min_train` vectors exist it serves from a flat index; then it trains
    k-means on what it holds and moves everything into the inverted lists."""

    kind = "faiss_ivf"
    brute_force_max = BRUTE_FORCE_MAX

    def __init__(
        self,
        dim: int,
        *,
        nlist: int | None = None,
        nprobe: int | None = None,
        min_train: int = 1000,
        use_gpu: bool = True,
    ) -> None:
        super().__init__(dim)
        self.nlist = nlist
        self.nprobe = nprobe
        self.min_train = min_train
        self.use_gpu = use_gpu
        self._staging: Any = faiss.IndexIDMap2(faiss.IndexFlatIP(dim))
        self._ivf: Any = None
        self._trained_nlist: int | None = None
        self._trained_n = 0
        self._gpu = _GpuReplica()
        self._gpu.enabled = self._gpu.enabled and use_gpu

    @property
    def params(self) -> dict[str, Any]:
        return {
            "nlist": self.nlist,
            "nprobe": self.nprobe,
            "min_train": self.min_train,
            "use_gpu": self.use_gpu,
        }

    @property
    def is_trained(self) -> bool:
        return self._ivf is not None

    @property
    def effective_nlist(self) -> int | None:
        return self._trained_nlist

    def default_nprobe(self) -> int:
        nlist = self._trained_nlist or 1
        if self.nprobe is not None:
            return min(self.nprobe, nlist)
        # Sentence embeddings spread over many cells. Measured on MiniLM vectors, recall@10
        # >= 0.95 needed ~40% of the lists at 1.5k vectors, ~25% at 6k, ~15% at 25k:
        # a fraction shrinking as n^-0.35 of the training set size.
        fraction = min(1.0, 6.0 / max(self._trained_n, 1) ** 0.35)
        return min(nlist, max(8, math.ceil(nlist * fraction)))

    @property
    def needs_retrain(self) -> bool:
        """Grown far past what the lists were trained on: a rebuild retrains them."""
        return self._ivf is not None and len(self._live) > 4 * max(self._trained_n, 1)

    @staticmethod
    def auto_nlist(n: int) -> int:
        # ~4 sqrt(n) lists, and at least 39 training points per list as faiss recommends.
        return max(1, min(int(4 * math.sqrt(n)), n // 39, 65536))

    def _make_ivf(self, nlist: int) -> Any:
        quantizer = faiss.IndexFlatIP(self.dim)
        ivf = faiss.IndexIVFFlat(quantizer, self.dim, nlist, faiss.METRIC_INNER_PRODUCT)
        return ivf

    def _active(self) -> Any:
        return self._ivf if self._ivf is not None else self._staging

    def add(self, ids: Ids, vectors: Vectors) -> None:
        ids, vectors = check_add(ids, vectors, self.dim)
        if not len(ids):
            return
        with self._lock.write():
            existing = self._present(ids)
            if len(existing):
                self._active().remove_ids(faiss.IDSelectorArray(existing))
            self._active().add_with_ids(vectors, ids)
            self._live.update(ids.tolist())
            self._gpu.invalidate()
            if self._ivf is None and len(self._live) >= self.min_train:
                self._train_from_staging()

    def _train_from_staging(self) -> None:
        staging = self._staging
        n = int(staging.ntotal)
        labels = faiss.vector_to_array(staging.id_map).astype(np.int64)
        vectors = staging.index.reconstruct_n(0, n)
        nlist = self.nlist or self.auto_nlist(n)
        nlist = max(1, min(nlist, n))
        ivf = self._make_ivf(nlist)
        ivf.train(vectors)
        ivf.set_direct_map_type(faiss.DirectMap.Hashtable)
        ivf.add_with_ids(vectors, labels)
        self._ivf, self._trained_nlist, self._trained_n = ivf, nlist, n
        self._staging = faiss.IndexIDMap2(faiss.IndexFlatIP(self.dim))
        log.info("%s trained: %d lists over %d vectors", self.kind, nlist, n)

    def remove(self, ids: Ids) -> int:
        with self._lock.write():
            existing = self._present(as_ids(ids))
            if len(existing):
                self._active().remove_ids(faiss.IDSelectorArray(existing))
                self._live.difference_update(existing.tolist())
                self._gpu.invalidate()
            return len(existing)

    @_one_thread_for_few
    def search(
        self, queries: Vectors, params: SearchParams, allowed: Allowed | None = None
    ) -> list[Hits]:
        queries = as_vectors(queries, self.dim)
        with self._lock.read():
            subset = None if allowed is None else self._allowed_live(allowed)
            limit = len(self._live) if subset is None else len(subset)
            k = min(params.k, limit)
            if k == 0:
                return self._empty(len(queries))
            if self._ivf is None:
                sel = None if subset is None else faiss.IDSelectorBatch(subset)
                scores, labels = self._staging.search(
                    queries, k, params=faiss.SearchParameters(sel=sel)
                )
                return unpad(scores, labels)
            if subset is not None and len(subset) <= self.brute_force_max:
                vectors = self._ivf.reconstruct_batch(subset)
                return brute_force(queries, vectors, subset, k)
            assert self._trained_nlist is not None
            # Asking for everything it holds (or exact) scans every list.
            exhaustive = params.exact or k >= limit
            nprobe = self._trained_nlist if exhaustive else (params.nprobe or 0)
            nprobe = min(nprobe or self.default_nprobe(), self._trained_nlist)
            if subset is None:
                gpu = self._gpu.get(self._ivf)
                if gpu is not None:
                    try:
                        scores, labels = gpu.search(
                            queries, k, params=faiss.SearchParametersIVF(nprobe=nprobe)
                        )
                        return unpad(scores, labels)
                    except Exception:
                        log.warning("faiss GPU search failed; using CPU", exc_info=True)
                        self._gpu.enabled = False
            sel = None if subset is None else faiss.IDSelectorBatch(subset)
            search_params = faiss.SearchParametersIVF(nprobe=nprobe, sel=sel)
            scores, labels = self._ivf.search(queries, k, params=search_params)
            # The probed lists may hold fewer than k (allowed) vectors: probe more for the
            # rows that came up short, so a search returns min(k, count) like any index.
            while nprobe < self._trained_nlist:
                short = np.flatnonzero((labels < 0).any(axis=1))
                if not len(short):
                    break
                nprobe = min(nprobe * 4, self._trained_nlist)
                search_params = faiss.SearchParametersIVF(nprobe=nprobe, sel=sel)
                scores[short], labels[short] = self._ivf.search(
                    queries[short], k, params=search_params
                )
            return unpad(scores, labels)

    def save(self, path: Path) -> None:
        with self._lock.read():
            faiss.write_index(self._active(), str(path / INDEX_FILE))
            write_meta(
                path,
                self.kind,
                self.dim,
                self.params,
                count=len(self._live),
                trained_nlist=self._trained_nlist,
                trained_n=self._trained_n,
            )

    @classmethod
    def load(cls, path: Path) -> FaissIVFIndex:
        meta = read_meta(path, cls.kind)
        index = cls(int(meta["dim"]), **meta["params"])
        stored = faiss.read_index(str(path / INDEX_FILE))
        if meta.get("trained_nlist"):
            index._ivf = stored
            index._trained_nlist = int(meta["trained_nlist"])
            index._trained_n = int(meta.get("trained_n") or 0)
            stored.set_direct_map_type(faiss.DirectMap.Hashtable)
            labels = _ivf_labels(stored)
        else:
            index._staging = stored
            labels = faiss.vector_to_array(stored.id_map)
        index._live = set(labels.tolist())
        return index


class FaissIVFSQ8Index(FaissIVFIndex):
    """IVF with 8-bit scalar-quantised residuals: a quarter of IVF-Flat's memory."""

    kind = "faiss_ivf_sq8"

    def _make_ivf(self, nlist: int) -> Any:
        quantizer = faiss.IndexFlatIP(self.dim)
        ivf = faiss.IndexIVFScalarQuantizer(
            quantizer,
            self.dim,
            nlist,
            faiss.ScalarQuantizer.QT_8bit,
            faiss.METRIC_INNER_PRODUCT,
        )
        return ivf


def _ivf_labels(ivf: Any) -> npt.NDArray[np.int64]:
    invlists = ivf.invlists
    parts = []
    for list_no in range(ivf.nlist):
        size = invlists.list_size(list_no)
        if size:
            ptr = invlists.get_ids(list_no)
            parts.append(faiss.rev_swig_ptr(ptr, size).copy())
    if not parts:
        return np.zeros(0, np.int64)
    return np.concatenate(parts).astype(np.int64)


class FaissHNSWIndex(_FaissBase):
    """faiss HNSW-Flat. faiss HNSW cannot remove, so a removed or replaced label's slot is
    tombstoned and excluded inside the search by an ID bitmap; a rebuild reclaims it."""

    kind = "faiss_hnsw"
    brute_force_max = BRUTE_FORCE_MAX

    def __init__(
        self,
        dim: int,
        *,
        m: int = 32,
        ef_construction: int = 80,
        ef_search: int | None = None,  # None: auto_ef_search(len(self))
    ) -> None:
        super().__init__(dim)
        self.m = m
        self.ef_construction = ef_construction
        self.ef_search = ef_search
        self._index = faiss.IndexHNSWFlat(dim, m, faiss.METRIC_INNER_PRODUCT)
        self._index.hnsw.efConstruction = ef_construction
        self._labels = np.zeros(0, dtype=np.int64)  # slot -> label
        self._alive = np.zeros(0, dtype=bool)  # slot -> not tombstoned
        self._slot: dict[int, int] = {}  # live label -> slot
        self._ef = self.default_ef_search()  # index-wide efSearch, for unfiltered searches
        self._index.hnsw.efSearch = self._ef
        self._params_by_ef: dict[int, Any] = {}
        self._live = self._slot
        self._live_bitmap: npt.NDArray[np.uint8] | None = None  # cache, None when stale
        self._ntotal = 0  # slots in the graph, live or tombstoned (ntotal without SWIG)

    @property
    def params(self) -> dict[str, Any]:
        return {"m": self.m, "ef_construction": self.ef_construction, "ef_search": self.ef_search}

    @property
    def deleted_count(self) -> int:
        return self._ntotal - len(self._slot)

    def default_ef_search(self) -> int:
        """The ef used when a search does not name one."""
        return self.ef_search or auto_ef_search(len(self._slot))

    def add(self, ids: Ids, vectors: Vectors) -> None:
        ids, vectors = check_add(ids, vectors, self.dim)
        if not len(ids):
            return
        with self._lock.write():
            self._tombstone(ids)
            start = int(self._index.ntotal)
            self._index.add(vectors)
            n = start + len(ids)
            self._labels = _grow(self._labels, n)
            self._alive = _grow(self._alive, n)
            self._labels[start:n] = ids
            self._alive[start:n] = True
            self._slot.update(zip(ids.tolist(), range(start, n), strict=True))
            self._ntotal = n
            self._live_bitmap = None

    def _tombstone(self, ids: Ids) -> int:
        removed = 0
        for label in ids.tolist():
            slot = self._slot.pop(label, None)
            if slot is not None:
                self._alive[slot] = False
                removed += 1
        if removed:
            self._live_bitmap = None
        return removed

    def remove(self, ids: Ids) -> int:
        with self._lock.write():
            return self._tombstone(as_ids(ids))

    def _bitmap(self, subset: Ids | None) -> tuple[Any, npt.NDArray[np.uint8]] | None:
        """An ID selector over slots: live ones, intersected with `subset` labels."""
        n = int(self._index.ntotal)
        if subset is None:
            if self.deleted_count == 0:
                return None
            if self._live_bitmap is None:
                self._live_bitmap = np.packbits(self._alive[:n], bitorder="little")
            bits = self._live_bitmap
        else:
            mask = np.zeros(n, dtype=bool)
            mask[[self._slot[label] for label in subset.tolist()]] = True
            bits = np.packbits(mask, bitorder="little")
        return faiss.IDSelectorBitmap(len(bits), faiss.swig_ptr(bits)), bits

    @_one_thread_for_few
    def search(
        self, queries: Vectors, params: SearchParams, allowed: Allowed | None = None
    ) -> list[Hits]:
        queries = as_vectors(queries, self.dim)
        if allowed is None and not params.exact:
            # The common case: no filter, no tombstones. A plain search at the index-wide
            # efSearch (like hnswlib's set_ef) skips building per-call SWIG parameters.
            ef = max(params.ef_search or self.default_ef_search(), params.k)
            with self._lock.read():
                if ef == self._ef:
                    hits = self._plain(queries, params.k)
                    if hits is not None:
                        return hits
            if ef != self._ef:
                with self._lock.write():
                    self._index.hnsw.efSearch = ef
                    self._ef = ef
                    hits = self._plain(queries, params.k)
                    if hits is not None:
                        return hits
        return self._search(queries, params, allowed)

    def _plain(self, queries: Vectors, k: int) -> list[Hits] | None:
        """Unfiltered graph search, or None when it does not apply (tombstones, k covering
        every vector, or a walk that came back short)."""
        limit = len(self._slot)
        if k >= limit or self.deleted_count:
            return None
        scores, slots = self._index.search(queries, k)
        if slots.min() < 0:
            return None
        labels = self._labels[slots]
        return [Hits(labels[i], scores[i]) for i in range(labels.shape[0])]

    def _search(
        self, queries: Vectors, params: SearchParams, allowed: Allowed | None
    ) -> list[Hits]:
        with self._lock.read():
            subset = None if allowed is None else self._allowed_live(allowed)
            limit = len(self._slot) if subset is None else len(subset)
            k = min(params.k, limit)
            if k == 0:
                return self._empty(len(queries))
            if subset is not None and len(subset) <= self.brute_force_max:
                slots = np.array([self._slot[label] for label in subset.tolist()], np.int64)
                return brute_force(queries, self._storage_vectors()[slots], subset, k)
            selector = self._bitmap(subset)
            sel = None if selector is None else selector[0]
            if params.exact or k >= limit:
                storage = faiss.downcast_index(self._index.storage)
                search_params = faiss.SearchParameters(sel=sel)
                scores, slots = storage.search(queries, k, params=search_params)
            else:
                ef = max(params.ef_search or self.default_ef_search(), k)
                search_params = (
                    self._hnsw_params(ef)
                    if sel is None
                    else (faiss.SearchParametersHNSW(efSearch=ef, sel=sel))
                )
                scores, slots = self._index.search(queries, k, params=search_params)
                if slots.min() >= 0:  # the usual case: k found for every query
                    return unpad(scores, self._labels[slots])
                short = np.flatnonzero((slots < 0).any(axis=1))
                if len(short):
                    # Tombstones or a filter cut the walk short: scan for those rows.
                    storage = faiss.downcast_index(self._index.storage)
                    scores[short], slots[short] = storage.search(
                        queries[short], k, params=faiss.SearchParameters(sel=sel)
                    )
            labels = np.where(slots >= 0, self._labels[np.maximum(slots, 0)], -1)
            return unpad(scores, labels)

    def _hnsw_params(self, ef: int) -> Any:
        """Search parameters without a selector, made once per ef (SWIG objects are not
        free to build on every query)."""
        cached = self._params_by_ef.get(ef)
        if cached is None:
            cached = self._params_by_ef[ef] = faiss.SearchParametersHNSW(efSearch=ef)
        return cached

    def _storage_vectors(self) -> Vectors:
        storage = faiss.downcast_index(self._index.storage)
        n = int(storage.ntotal)
        return faiss.rev_swig_ptr(storage.get_xb(), n * self.dim).reshape(n, self.dim)

    def save(self, path: Path) -> None:
        with self._lock.read():
            n = int(self._index.ntotal)
            faiss.write_index(self._index, str(path / INDEX_FILE))
            np.save(path / "labels.npy", self._labels[:n])
            np.save(path / "alive.npy", self._alive[:n])
            write_meta(path, self.kind, self.dim, self.params, count=len(self._slot))

    @classmethod
    def load(cls, path: Path) -> FaissHNSWIndex:
        meta = read_meta(path, cls.kind)
        index = cls(int(meta["dim"]), **meta["params"])
        index._index = faiss.read_index(str(path / INDEX_FILE))
        index._labels = np.load(path / "labels.npy", allow_pickle=False).astype(np.int64)
        index._alive = np.load(path / "alive.npy", allow_pickle=False).astype(bool)
        if len(index._labels) != index._index.ntotal or len(index._alive) != len(index._labels):
            raise ValueError(f"{path}: label table does not match the index")
        slots = np.flatnonzero(index._alive)
        index._slot = dict(zip(index._labels[slots].tolist(), slots.tolist(), strict=True))
        index._live = index._slot
        index._ntotal = len(index._labels)
        index._ef = index.default_ef_search()
        index._index.hnsw.efSearch = index._ef
        return index


def _grow(arr: npt.NDArray[Any], n: int) -> npt.NDArray[Any]:
    if n <= arr.shape[0]:
        return arr
    out = np.zeros(max(n, 2 * arr.shape[0], 1024), dtype=arr.dtype)
    out[: arr.shape[0]] = arr
    return out
