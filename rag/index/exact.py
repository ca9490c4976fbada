"""Brute-force inner product in numpy: the oracle every other backend is measured against."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

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
    brute_force,
    check_add,
    read_meta,
    write_meta,
)
from rag.index.filters import Where
from rag.index.params import Param
from rag.knobs import Knobs

log = logging.getLogger(__name__)


class ExactIndex(InProcess):
    """Rows in one growable matrix; a label maps to its row, removal moves the last row in."""

    kind = "exact"
    shared = False
    snapshots = True
    wants_attributes = False
    filters_inside = False
    param_schema: Mapping[str, Param] = {}

    def __init__(self, dim: int, **params: Any) -> None:
        if params:
            raise TypeError(f"exact index takes no parameters, got {sorted(params)}")
        self.dim = dim
        self._vectors = np.zeros((0, dim), dtype=np.float32)  # [capacity, dim]
        self._labels = np.zeros(0, dtype=np.int64)  # [capacity]
        self._n = 0
        self._row: dict[int, int] = {}
        self._lock = RWLock()

    @property
    def params(self) -> dict[str, Any]:
        return {}

    def __len__(self) -> int:
        return self._n

    def ids(self) -> Ids:
        with self._lock.read():
            return self._labels[: self._n].copy()

    def add(self, ids: Ids, vectors: Vectors, attrs: Attrs | None = None) -> None:
        ids, vectors = check_add(ids, vectors, self.dim)
        with self._lock.write():
            for label, vector in zip(ids.tolist(), vectors, strict=True):
                row = self._row.get(label)
                if row is None:
                    row = self._n
                    self._grow(row + 1)
                    self._row[label] = row
                    self._labels[row] = label
                    self._n += 1
                self._vectors[row] = vector

    def _grow(self, needed: int) -> None:
        capacity = self._vectors.shape[0]
        if needed <= capacity:
            return
        new_capacity = max(needed, 2 * capacity, 1024)
        vectors = np.zeros((new_capacity, self.dim), dtype=np.float32)
        vectors[: self._n] = self._vectors[: self._n]
        labels = np.zeros(new_capacity, dtype=np.int64)
        labels[: self._n] = self._labels[: self._n]
        self._vectors, self._labels = vectors, labels

    def remove(self, ids: Ids) -> int:
        removed = 0
        with self._lock.write():
            for label in as_ids(ids).tolist():
                row = self._row.pop(label, None)
                if row is None:
                    continue
                last = self._n - 1
                if row != last:
                    moved = int(self._labels[last])
                    self._vectors[row] = self._vectors[last]
                    self._labels[row] = moved
                    self._row[moved] = row
                self._n -= 1
                removed += 1
        return removed

    def erase(self, ids: Ids) -> int:
        removed = self.remove(ids)
        with self._lock.write():
            # Rows past the live ones still hold what removal moved out of the way.
            self._vectors[self._n :] = 0.0
            self._labels[self._n :] = 0
        return removed

    def search(
        self,
        queries: Vectors,
        knobs: Knobs,
        allowed: Allowed | None = None,
        where: Where | None = None,
    ) -> list[Hits]:
        queries = as_vectors(queries, self.dim)
        with self._lock.read():
            vectors = self._vectors[: self._n]
            labels = self._labels[: self._n]
            if allowed is not None:
                mask = np.isin(labels, allowed_array(allowed))
                vectors, labels = vectors[mask], labels[mask]
            return brute_force(queries, vectors, labels, knobs.top_k)

    def save(self, path: Path) -> None:
        with self._lock.read():
            np.save(path / "labels.npy", self._labels[: self._n])
            np.save(path / "vectors.npy", self._vectors[: self._n])
            write_meta(path, self.kind, self.dim, self.params, count=self._n)

    @classmethod
    def load(cls, path: Path) -> ExactIndex:
        meta = read_meta(path, cls.kind)
        index = cls(int(meta["dim"]))
        labels = np.load(path / "labels.npy", allow_pickle=False)
        vectors = np.load(path / "vectors.npy", allow_pickle=False)
        index.add(labels, vectors)
        return index
