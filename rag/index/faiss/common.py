"""What the FAISS backends share: the module handle, the OpenMP guard for one-query
searches, the GPU replica, and the base holding the live labels and the lock.

Quirks hidden by the backends: faiss pads missing results with -1 (dropped); IVF needs
training; faiss HNSW cannot remove (labels are tombstoned and filtered out inside the search
with an ID bitmap); searching while adding is unsafe (a readers-writer lock guards each index).
When faiss sees a GPU, Flat and IVF searches without a filter run on a GPU replica of the CPU
index; the CPU index stays the one that is mutated and saved.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any, TypeVar, cast

import faiss as _faiss
import numpy as np

from rag.index.base import Allowed, Hits, Ids, InProcess, RWLock, allowed_array

log = logging.getLogger(__name__)

# faiss's SWIG type stubs miss most of its Python API; treat the module as untyped.
faiss: Any = _faiss

INDEX_FILE = "index.faiss"
# Below this many allowed labels a filtered search scans their vectors exactly.
BRUTE_FORCE_MAX = 2048


# Searches of at most this many queries (a request's one) run on the calling thread alone.
FEW_QUERIES = 4

_Search = TypeVar("_Search", bound=Callable[..., list[Hits]])


def one_thread_for_few(search: _Search) -> _Search:
    """Run a search of a few queries without an OpenMP team.

    faiss parallelises a search over its queries; for a request's single query that buys
    nothing, and the team's threads then spin for a while (libgomp's default wait policy),
    on the cores the next request needs to embed its query: on 2 cores `/search` over a flat
    index was markedly slower with the team (bench/search.py; docs/decisions.md).
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

    return cast(_Search, wrapper)


def gpu_available() -> bool:
    return hasattr(faiss, "StandardGpuResources") and faiss.get_num_gpus() > 0


class GpuReplica:
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


class FaissBase(InProcess):
    kind = ""
    shared = False
    snapshots = True
    wants_attributes = False
    filters_inside = False

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
