"""FAISS IVF-Flat and IVF-SQ8. Until `min_train` vectors exist an IVF index serves from a
flat staging index; then it trains k-means on what it holds (a rebuild retrains with the data
it has then)."""

from __future__ import annotations

import logging
import math
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
    GpuReplica,
    faiss,
    one_thread_for_few,
)
from rag.index.filters import Where
from rag.index.params import Param
from rag.knobs import Knobs

log = logging.getLogger(__name__)


MAX_NLIST = 4096


class FaissIVFIndex(FaissBase):
    """IVF-Flat. Until `min_train` vectors exist it serves from a flat index; then it trains
    k-means on what it holds and moves everything into the inverted lists."""

    kind = "faiss_ivf"
    effort_knob = "nprobe"
    brute_force_max = BRUTE_FORCE_MAX
    # k-means costs n x nlist x dim an iteration, in the process that serves searches:
    # 4,096 lists suit up to ~1 M vectors (~4 sqrt(n)); 65,536 was minutes of CPU a rebuild.
    param_schema: Mapping[str, Param] = {
        "nlist": Param(int, 1, MAX_NLIST, nullable=True, doc="inverted lists (None: ~4 sqrt(n))"),
        "nprobe": Param(int, 1, MAX_NLIST, nullable=True, doc="default lists scanned"),
        "min_train": Param(int, 1, 10_000_000, doc="vectors before k-means is trained"),
        "use_gpu": Param(bool, doc="a GPU replica for searches, when there is one"),
    }

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
        self._gpu = GpuReplica()
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

    def default_nprobe(self) -> int:
        nlist = self._trained_nlist or 1
        if self.nprobe is not None:
            return min(self.nprobe, nlist)
        # Sentence embeddings spread over many cells. On MiniLM vectors the share of the lists
        # that recall@10 >= 0.95 needs shrinks with the training set, about as n^-0.35
        # (docs/decisions.md; bench/search.py sweeps nprobe).
        fraction = min(1.0, 6.0 / max(self._trained_n, 1) ** 0.35)
        return min(nlist, max(8, math.ceil(nlist * fraction)))

    def nprobe_max(self) -> int:
        return self._trained_nlist or 0

    @property
    def needs_retrain(self) -> bool:
        """Grown far past what the lists were trained on: a rebuild retrains them."""
        return self._ivf is not None and len(self._live) > 4 * max(self._trained_n, 1)

    @staticmethod
    def auto_nlist(n: int) -> int:
        # ~4 sqrt(n) lists, and at least 39 training points per list as faiss recommends.
        return max(1, min(int(4 * math.sqrt(n)), n // 39, MAX_NLIST))

    def _make_ivf(self, nlist: int) -> Any:
        quantizer = faiss.IndexFlatIP(self.dim)
        ivf = faiss.IndexIVFFlat(quantizer, self.dim, nlist, faiss.METRIC_INNER_PRODUCT)
        return ivf

    def _active(self) -> Any:
        return self._ivf if self._ivf is not None else self._staging

    def add(self, ids: Ids, vectors: Vectors, attrs: Attrs | None = None) -> None:
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
        nlist = max(1, min(nlist, n // 39))  # faiss's fewest training points a list
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

    def erase(self, ids: Ids) -> int:
        # remove_ids takes the codes out of the inverted lists (or the flat staging index):
        # nothing of a removed vector is saved. The centroids were trained on what the index
        # held then, deleted vectors included: means of dozens of vectors each, not copies;
        # a rebuild retrains them.
        return self.remove(ids)

    @one_thread_for_few
    def search(
        self,
        queries: Vectors,
        knobs: Knobs,
        allowed: Allowed | None = None,
        where: Where | None = None,
    ) -> list[Hits]:
        queries = as_vectors(queries, self.dim)
        with self._lock.read():
            subset = None if allowed is None else self._allowed_live(allowed)
            limit = len(self._live) if subset is None else len(subset)
            k = min(knobs.top_k, limit)
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
            exhaustive = knobs.exact or k >= limit
            nprobe = self._trained_nlist if exhaustive else (knobs.nprobe or 0)
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
