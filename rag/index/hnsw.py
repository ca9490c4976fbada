"""hnswlib's HNSW graph.

hnswlib quirks hidden here: it is not safe for concurrent add and search (a readers-writer lock
guards it), `set_ef` is index-wide state (a search that needs another ef takes the write side),
and `knn_query` raises when it cannot find k results, which happens when k exceeds the live
count, after deletes, or under a tight filter.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import hnswlib
import numpy as np

from rag.index.base import (
    Allowed,
    Attrs,
    Hits,
    Ids,
    InProcess,
    RWLock,
    Vectors,
    allowed_array,
    as_ids,
    as_vectors,
    auto_ef_search,
    brute_force,
    check_add,
    merge_hits,
    read_meta,
    write_meta,
)
from rag.index.filters import Where
from rag.index.params import Param
from rag.knobs import Knobs

log = logging.getLogger(__name__)

INDEX_FILE = "hnsw.bin"
LABELS_FILE = "labels.npy"
# Below this many allowed labels a filtered search is brute force over their vectors: exact,
# and cheaper than walking a graph whose nodes are mostly filtered out.
BRUTE_FORCE_MAX = 2048
_BLOCK = 8192


class HnswIndex(InProcess):
    kind = "hnsw"
    shared = False
    snapshots = True
    wants_attributes = False
    filters_inside = False
    effort_knob = "ef_search"
    brute_force_max = BRUTE_FORCE_MAX
    # hnswlib allocates capacity x (vector + 2m links) at once: at 384-d and m=16 the
    # largest initial capacity is ~170 MB (it grows by doubling as vectors arrive anyway).
    param_schema: Mapping[str, Param] = {
        "m": Param(int, 2, 128, doc="links per node"),
        "ef_construction": Param(int, 1, 4096, doc="candidate list while building"),
        "ef_search": Param(int, 1, 10_000, nullable=True, doc="default search candidates"),
        "initial_capacity": Param(int, 0, 100_000, doc="vectors allocated up front"),
        "seed": Param(int, 0, 2**31 - 1),
    }

    def __init__(
        self,
        dim: int,
        *,
        m: int = 16,
        ef_construction: int = 200,
        ef_search: int | None = None,  # None: auto_ef_search(len(self))
        initial_capacity: int = 1024,
        seed: int = 100,
    ) -> None:
        self.dim = dim
        self.m = m
        self.ef_construction = ef_construction
        self.ef_search = ef_search
        self.seed = seed
        self._index = hnswlib.Index(space="ip", dim=dim)
        self._index.init_index(
            max_elements=max(initial_capacity, 16),
            ef_construction=ef_construction,
            M=m,
            random_seed=seed,
        )
        # hnswlib keeps deleted labels in its lookup table, so the live set is tracked here.
        self._live: set[int] = set()
        self._ef = self.default_ef_search()  # index-wide; searches follow the size
        self._index.set_ef(self._ef)
        # (labels, vectors) of the live set for exact search; None when stale.
        self._matrix: tuple[Ids, Vectors] | None = None
        self._matrix_lock = threading.Lock()
        self._lock = RWLock()

    @property
    def params(self) -> dict[str, Any]:
        return {
            "m": self.m,
            "ef_construction": self.ef_construction,
            "ef_search": self.ef_search,
            "seed": self.seed,
        }

    def __len__(self) -> int:
        return len(self._live)

    def default_ef_search(self) -> int:
        """The ef used when a search does not name one."""
        return self.ef_search or auto_ef_search(len(self._live))

    @property
    def deleted_count(self) -> int:
        """Slots held by deleted labels, reclaimed only by a rebuild."""
        return int(self._index.get_current_count()) - len(self._live)

    def ids(self) -> Ids:
        with self._lock.read():
            return np.fromiter(self._live, dtype=np.int64, count=len(self._live))

    def add(self, ids: Ids, vectors: Vectors, attrs: Attrs | None = None) -> None:
        ids, vectors = check_add(ids, vectors, self.dim)
        if not len(ids):
            return
        with self._lock.write():
            needed = int(self._index.get_current_count()) + len(ids)
            capacity = int(self._index.get_max_elements())
            if needed > capacity:
                self._index.resize_index(max(needed, 2 * capacity))
            # An existing label (live or deleted) is updated in place and un-deleted.
            threads = -1 if len(ids) >= 1000 else 1  # big builds use every core
            self._index.add_items(vectors, ids, num_threads=threads)
            self._live.update(ids.tolist())
            self._matrix = None

    def remove(self, ids: Ids) -> int:
        removed = 0
        with self._lock.write():
            for label in as_ids(ids).tolist():
                if label in self._live:
                    self._index.mark_deleted(label)
                    self._live.discard(label)
                    removed += 1
            if removed:
                self._matrix = None
        return removed

    def erase(self, ids: Ids) -> int:
        """Remove, then overwrite the vectors of these labels with zeros: hnswlib's
        mark_deleted keeps a deleted element's vector (in memory and in `save`'s file) until
        a rebuild. Adding to an existing label updates it in place (and un-deletes it), so
        the labels get a zero vector and are marked deleted again; they stay nodes of the
        graph, which walks still pass."""
        ids = as_ids(ids)
        with self._lock.write():
            removed = sum(1 for label in ids.tolist() if label in self._live)
            wanted = set(ids.tolist())
            known = np.array(
                [label for label in self._index.get_ids_list() if label in wanted], np.int64
            )
            if len(known):
                self._index.add_items(np.zeros((len(known), self.dim), np.float32), known)
                for label in known.tolist():
                    self._index.mark_deleted(label)
                self._live.difference_update(known.tolist())
                self._matrix = None
        return removed

    def search(
        self,
        queries: Vectors,
        knobs: Knobs,
        allowed: Allowed | None = None,
        where: Where | None = None,
    ) -> list[Hits]:
        queries = as_vectors(queries, self.dim)
        ef = max(knobs.ef_search or self.default_ef_search(), knobs.top_k)
        if allowed is None and not knobs.exact:
            # The common case (no filter, the graph at the current ef) in as few steps as
            # possible: this path is most of a search's time outside hnswlib itself.
            with self._lock.read():
                if self._ef == ef and knobs.top_k < len(self._live):
                    return self._query(queries, knobs.top_k, ef, None)
        labels = None if allowed is None else allowed_array(allowed)
        with self._lock.read():
            if self._ef == ef or not self._needs_graph(knobs, labels):
                return self._search_locked(queries, knobs, ef, labels)
        # Another ef than the index's current one: set_ef is index-wide state.
        with self._lock.write():
            self._index.set_ef(ef)
            self._ef = ef
            return self._search_locked(queries, knobs, ef, labels)

    def _needs_graph(self, knobs: Knobs, labels: Ids | None) -> bool:
        if knobs.exact:
            return False
        limit = len(self._live) if labels is None else len(labels)
        return knobs.top_k < limit and (labels is None or limit > self.brute_force_max)

    def _search_locked(
        self, queries: Vectors, knobs: Knobs, ef: int, labels: Ids | None
    ) -> list[Hits]:
        if knobs.exact:
            return self._brute_force(queries, None, knobs.top_k)
        allowed_set: set[int] | None = None
        limit = len(self._live)
        if labels is not None:
            allowed_set = {x for x in labels.tolist() if x in self._live}
            limit = len(allowed_set)
            if limit <= self.brute_force_max:
                return self._brute_force(queries, allowed_set, knobs.top_k)
        k = min(knobs.top_k, limit)
        if k == 0:
            return [Hits() for _ in range(len(queries))]
        if k >= limit:
            # Everything it holds was asked for: a scan cannot miss any of it.
            return self._brute_force(queries, allowed_set, k)
        return self._query(queries, k, ef, allowed_set)

    def _query(self, queries: Vectors, k: int, ef: int, allowed: set[int] | None) -> list[Hits]:
        try:
            if allowed is None:
                labels, dists = self._index.knn_query(queries, k=k, num_threads=1)
            else:
                labels, dists = self._index.knn_query(
                    queries, k=k, num_threads=1, filter=allowed.__contains__
                )
        except RuntimeError:
            # Fewer than k reachable (deletes cut the graph, or a filter): per query, fall
            # back to an exact scan rather than returning less than the index holds.
            log.debug("hnswlib could not return %d results at ef %d; scanning", k, ef)
            return self._brute_force(queries, allowed, k)
        # hnswlib's "ip" distance is 1 - dot, in a fresh float32 array it hands over: turn
        # it into scores in place. Its uint64 labels are chunk ids (< 2**63): reinterpret.
        ids = labels.view(np.int64)
        scores = np.subtract(1.0, dists, out=dists)
        return [Hits(ids[i], scores[i]) for i in range(ids.shape[0])]

    def _brute_force(self, queries: Vectors, allowed: set[int] | None, k: int) -> list[Hits]:
        if allowed is None:
            # Exact search over everything: a cached copy of the live vectors, so `exact`
            # costs one matrix product, not a copy out of hnswlib per query.
            labels, vectors = self._live_matrix()
            return brute_force(queries, vectors, labels, k)
        labels = np.fromiter(allowed, dtype=np.int64, count=len(allowed))
        parts = []
        for start in range(0, len(labels), _BLOCK):
            block = labels[start : start + _BLOCK]
            vectors = np.asarray(self._index.get_items(block, return_type="numpy"), np.float32)
            parts.append(brute_force(queries, vectors, block, k))
        if not parts:
            return [Hits() for _ in range(len(queries))]
        return parts[0] if len(parts) == 1 else merge_hits(parts, k)

    def _live_matrix(self) -> tuple[Ids, Vectors]:
        cached = self._matrix
        if cached is None:
            with self._matrix_lock:
                cached = self._matrix
                if cached is None:
                    labels = np.fromiter(self._live, dtype=np.int64, count=len(self._live))
                    vectors = np.zeros((len(labels), self.dim), np.float32)
                    for start in range(0, len(labels), _BLOCK):
                        block = labels[start : start + _BLOCK]
                        vectors[start : start + len(block)] = self._index.get_items(
                            block, return_type="numpy"
                        )
                    cached = self._matrix = (labels, vectors)
        return cached

    def save(self, path: Path) -> None:
        with self._lock.read():
            self._index.save_index(str(path / INDEX_FILE))
            live = np.fromiter(self._live, dtype=np.int64, count=len(self._live))
            np.save(path / LABELS_FILE, np.sort(live))
            write_meta(path, self.kind, self.dim, self.params, count=len(live))

    @classmethod
    def load(cls, path: Path) -> HnswIndex:
        meta = read_meta(path, cls.kind)
        index = cls(int(meta["dim"]), **meta["params"], initial_capacity=0)
        # A fresh hnswlib object: loading into the one the constructor initialised would make
        # hnswlib free it and print a warning.
        index._index = hnswlib.Index(space="ip", dim=index.dim)
        index._index.load_index(str(path / INDEX_FILE))
        live = np.load(path / LABELS_FILE, allow_pickle=False)
        index._live = set(live.tolist())
        index._ef = index.default_ef_search()
        index._index.set_ef(index._ef)
        return index
