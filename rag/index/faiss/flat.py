"""FAISS Flat: exact inner product, on a GPU replica when faiss sees one."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rag.index.base import (
    Allowed,
    Attrs,
    Hits,
    Ids,
    Vectors,
    as_ids,
    as_vectors,
    check_add,
    read_meta,
    unpad,
    write_meta,
)
from rag.index.faiss.common import (
    INDEX_FILE,
    FaissBase,
    GpuReplica,
    faiss,
    one_thread_for_few,
)
from rag.index.filters import Where
from rag.index.params import Param
from rag.knobs import Knobs


class FaissFlatIndex(FaissBase):
    """Exact search; `remove_ids` compacts the storage."""

    kind = "faiss_flat"
    param_schema: Mapping[str, Param] = {
        "use_gpu": Param(bool, doc="a GPU replica for searches, when there is one")
    }

    def __init__(self, dim: int, *, use_gpu: bool = True) -> None:
        super().__init__(dim)
        self.use_gpu = use_gpu
        self._index = faiss.IndexIDMap2(faiss.IndexFlatIP(dim))
        self._gpu = GpuReplica()
        self._gpu.enabled = self._gpu.enabled and use_gpu

    @property
    def params(self) -> dict[str, Any]:
        return {"use_gpu": self.use_gpu}

    def add(self, ids: Ids, vectors: Vectors, attrs: Attrs | None = None) -> None:
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

    def erase(self, ids: Ids) -> int:
        # remove_ids compacts the flat storage: nothing of a removed vector is saved.
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
            if allowed is None:
                k = min(knobs.top_k, len(self._live))
                if k == 0:
                    return self._empty(len(queries))
                gpu = self._gpu.get(self._index)
                scores, labels = (gpu or self._index).search(queries, k)
                return unpad(scores, labels)
            subset = self._allowed_live(allowed)
            k = min(knobs.top_k, len(subset))
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
