"""FAISS HNSW (optionally SQ8-compressed). It cannot remove: labels are tombstoned and
filtered out inside the search with an ID bitmap, and a rebuild drops them."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from rag.index.base import (
    Allowed,
    Attrs,
    Hits,
    Ids,
    Vectors,
    as_ids,
    as_vectors,
    auto_ef_search,
    brute_force,
    check_add,
    read_meta,
    unpad,
    write_meta,
)
from rag.index.faiss.common import (
    BRUTE_FORCE_MAX,
    INDEX_FILE,
    FaissBase,
    faiss,
    one_thread_for_few,
)
from rag.index.filters import Where
from rag.index.params import Param
from rag.knobs import Knobs


class FaissHNSWIndex(FaissBase):
    """faiss HNSW-Flat. faiss HNSW cannot remove, so a removed or replaced label's slot is
    tombstoned and excluded inside the search by an ID bitmap; a rebuild reclaims it."""

    kind = "faiss_hnsw"
    effort_knob = "ef_search"
    brute_force_max = BRUTE_FORCE_MAX
    # faiss sizes its level-0 links as 2m per vector (m in the millions: gigabytes at once).
    param_schema: Mapping[str, Param] = {
        "m": Param(int, 2, 128, doc="links per node"),
        "ef_construction": Param(int, 1, 4096, doc="candidate list while building"),
        "ef_search": Param(int, 1, 10_000, nullable=True, doc="default search candidates"),
    }

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

    def add(self, ids: Ids, vectors: Vectors, attrs: Attrs | None = None) -> None:
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

    def erase(self, ids: Ids) -> int:
        """Tombstone, then overwrite the slots of these labels with zeros: faiss HNSW cannot
        remove, and a tombstoned slot keeps its vector (in memory and in `save`'s file)
        until a rebuild. The zero vector stays a node of the graph, which walks still pass."""
        ids = as_ids(ids)
        with self._lock.write():
            removed = self._tombstone(ids)
            n = self._ntotal
            dead = np.flatnonzero(np.isin(self._labels[:n], ids) & ~self._alive[:n])
            if len(dead):
                self._storage_vectors()[dead] = 0.0
        return removed

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

    @one_thread_for_few
    def search(
        self,
        queries: Vectors,
        knobs: Knobs,
        allowed: Allowed | None = None,
        where: Where | None = None,
    ) -> list[Hits]:
        queries = as_vectors(queries, self.dim)
        if allowed is None and not knobs.exact:
            # The common case: no filter, no tombstones. A plain search at the index-wide
            # efSearch (like hnswlib's set_ef) skips building per-call SWIG parameters.
            ef = max(knobs.ef_search or self.default_ef_search(), knobs.top_k)
            with self._lock.read():
                if ef == self._ef:
                    hits = self._plain(queries, knobs.top_k)
                    if hits is not None:
                        return hits
            if ef != self._ef:
                with self._lock.write():
                    self._index.hnsw.efSearch = ef
                    self._ef = ef
                    hits = self._plain(queries, knobs.top_k)
                    if hits is not None:
                        return hits
        return self._search(queries, knobs, allowed)

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

    def _search(self, queries: Vectors, knobs: Knobs, allowed: Allowed | None) -> list[Hits]:
        with self._lock.read():
            subset = None if allowed is None else self._allowed_live(allowed)
            limit = len(self._slot) if subset is None else len(subset)
            k = min(knobs.top_k, limit)
            if k == 0:
                return self._empty(len(queries))
            if subset is not None and len(subset) <= self.brute_force_max:
                slots = np.array([self._slot[label] for label in subset.tolist()], np.int64)
                return brute_force(queries, self._storage_vectors()[slots], subset, k)
            selector = self._bitmap(subset)
            sel = None if selector is None else selector[0]
            if knobs.exact or k >= limit:
                storage = faiss.downcast_index(self._index.storage)
                search_params = faiss.SearchParameters(sel=sel)
                scores, slots = storage.search(queries, k, params=search_params)
            else:
                ef = max(knobs.ef_search or self.default_ef_search(), k)
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
