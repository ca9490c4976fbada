"""The seam every vector index backend sits behind.

Vectors are L2-normalised float32 and the metric is inner product, so a score is a cosine.
Labels are the integer chunk ids from SQL. Backends hide their quirks here: faiss pads missing
results with -1, hnswlib raises when k exceeds what it can find; callers get neither.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

from rag.errors import Invalid
from rag.index.filters import Where
from rag.index.params import Param
from rag.knobs import Knobs

Ids = npt.NDArray[np.int64]
Vectors = npt.NDArray[np.float32]
# What a caller may pass as a filter: any collection of labels, or an int array of them.
Allowed = Collection[int] | npt.NDArray[np.integer[Any]]
# Each added row's (document id, metadata), for an index that filters inside its engine.
Attrs = Sequence[tuple[str, dict[str, Any]]]


@dataclass(frozen=True, slots=True)
class Hits:
    """One query's results, best first. Never padded: len(hits) <= k."""

    ids: Ids = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    scores: npt.NDArray[np.float32] = field(default_factory=lambda: np.zeros(0, dtype=np.float32))

    def __len__(self) -> int:
        return int(self.ids.shape[0])

    def __iter__(self) -> Iterator[tuple[int, float]]:
        return zip(self.ids.tolist(), self.scores.tolist(), strict=True)


@runtime_checkable
class VectorIndex(Protocol):
    """What every backend is. Its traits are class attributes each backend declares (the
    contract suite checks them); a method a backend has nothing to do for is a no-op there.
    How an index is kept in step with SQL is not its business: see rag.index.keeper."""

    kind: str  # its name in rag.index.KINDS
    dim: int
    # Traits.
    shared: bool  # lives in an engine every replica shares (the shared keeper keeps it)
    snapshots: bool  # `save` and `load` files of it (False: it lives in its engine)
    wants_attributes: bool  # `add` is given each row's document id and metadata
    filters_inside: bool  # `search` evaluates a `where` inside the engine's own search
    param_schema: Mapping[str, Param]  # the build parameters it takes, with their bounds

    def __init__(self, dim: int, **params: Any) -> None:
        """An empty index; `params` are among those `param_schema` declares."""
        ...

    @property
    def params(self) -> dict[str, Any]:
        """Build parameters, as recorded in a snapshot manifest."""
        ...

    @property
    def effort_knob(self) -> str | None:
        """The knob that sets a search's cost ("ef_search" or "nprobe"); None when nothing
        does (an exact scan): the retriever's budget reads it."""
        ...

    @property
    def needs_retrain(self) -> bool:
        """Grown far past what it was trained on: a rebuild retrains it."""
        ...

    @property
    def deleted_count(self) -> int:
        """Tombstones: slots removed labels hold until a rebuild reclaims them."""
        ...

    def default_ef_search(self) -> int:
        """The ef a search uses when it names none; 0 for a kind without a graph."""
        ...

    def default_nprobe(self) -> int:
        """The lists a search probes when it names none; 0 for a kind without lists."""
        ...

    def nprobe_max(self) -> int:
        """The most lists a search can probe (those trained); 0 for a kind without lists."""
        ...

    def add(self, ids: Ids, vectors: Vectors, attrs: Attrs | None = None) -> None:
        """Insert vectors under labels; re-adding a live label replaces its vector. `attrs`
        is kept only by an index that `wants_attributes`."""
        ...

    def remove(self, ids: Ids) -> int:
        """Remove labels (unknown ones are ignored); returns how many were live."""
        ...

    def erase(self, ids: Ids) -> int:
        """Remove labels for good (the purge of deleted documents): like `remove`, and no copy
        of their vectors is left in the memory the index keeps, in what `save` writes, or (an
        external engine) in its storage (delete, then compact), whether they were live or
        removed earlier and kept as tombstones. Returns how many were live."""
        ...

    def compact(self) -> None:
        """Have an engine reclaim the rows removes left in its storage now (an in-process
        index has none: `erase` already left nothing)."""
        ...

    def search(
        self,
        queries: Vectors,
        knobs: Knobs,
        allowed: Allowed | None = None,
        where: Where | None = None,
    ) -> list[Hits]:
        """Top-k per query row. `allowed` restricts results inside the search; so does
        `where` for an index that `filters_inside` (others ignore it: their caller resolved
        the filter to `allowed`)."""
        ...

    def ids(self) -> Ids:
        """Every live label."""
        ...

    def __len__(self) -> int: ...

    def save(self, path: Path) -> None:
        """Write the index into the (existing, empty) directory `path`."""
        ...

    @classmethod
    def load(cls, path: Path) -> VectorIndex: ...


class InProcess:
    """The `VectorIndex` members an index in this process's memory has nothing to do for:
    no knob sets its cost, nothing to retrain, no tombstones, nothing for an engine to
    compact. A backend overrides those it has."""

    @property
    def effort_knob(self) -> str | None:
        return None

    @property
    def needs_retrain(self) -> bool:
        return False

    @property
    def deleted_count(self) -> int:
        return 0

    def default_ef_search(self) -> int:
        return 0

    def default_nprobe(self) -> int:
        return 0

    def nprobe_max(self) -> int:
        return 0

    def compact(self) -> None:
        return None


# ----------------------------------------------------------------------------- helpers


def as_ids(ids: Any) -> Ids:
    arr = np.ascontiguousarray(np.asarray(ids, dtype=np.int64).reshape(-1))
    return arr


def as_vectors(vectors: Any, dim: int) -> Vectors:
    if (
        isinstance(vectors, np.ndarray)
        and vectors.dtype == np.float32
        and vectors.ndim == 2
        and vectors.shape[1] == dim
        and vectors.flags.c_contiguous
    ):
        return vectors  # the common case, on every search: no copy, no checks to redo
    arr = np.ascontiguousarray(np.asarray(vectors, dtype=np.float32))
    if arr.ndim == 1:
        arr = arr.reshape(1, -1)
    if arr.ndim != 2 or arr.shape[1] != dim:
        raise Invalid(f"expected vectors of shape [n, {dim}], got {tuple(arr.shape)}")
    return arr


def check_add(ids: Any, vectors: Any, dim: int) -> tuple[Ids, Vectors]:
    """Validate an add batch; a label repeated within the batch keeps its last vector."""
    ids_arr = as_ids(ids)
    vec_arr = as_vectors(vectors, dim) if len(ids_arr) else np.zeros((0, dim), np.float32)
    if vec_arr.shape[0] != ids_arr.shape[0]:
        raise Invalid(f"{len(ids_arr)} ids for {vec_arr.shape[0]} vectors")
    if len(ids_arr) and (ids_arr < 0).any():
        raise Invalid("labels must be non-negative")
    if len(np.unique(ids_arr)) != len(ids_arr):
        # Keep the last occurrence of each label, in the original order.
        _, last_rev = np.unique(ids_arr[::-1], return_index=True)
        keep = np.sort(len(ids_arr) - 1 - last_rev)
        ids_arr, vec_arr = ids_arr[keep], vec_arr[keep]
    return ids_arr, vec_arr


def allowed_array(allowed: Allowed) -> Ids:
    if isinstance(allowed, np.ndarray):
        return np.unique(allowed.astype(np.int64, copy=False))
    return np.unique(np.fromiter((int(a) for a in allowed), dtype=np.int64, count=len(allowed)))


def top_k(
    scores: npt.NDArray[np.float32], labels: Ids, k: int
) -> tuple[npt.NDArray[np.float32], Ids]:
    """Best k of one row of scores, sorted descending (ties by label for determinism)."""
    n = scores.shape[0]
    if n == 0:
        return np.zeros(0, np.float32), np.zeros(0, np.int64)
    part = np.argpartition(-scores, k - 1)[:k] if k < n else np.arange(n)
    order = np.lexsort((labels[part], -scores[part]))
    sel = part[order]
    return scores[sel].astype(np.float32, copy=False), labels[sel]


def brute_force(queries: Vectors, vectors: Vectors, labels: Ids, k: int) -> list[Hits]:
    """Exact inner-product top-k of every query over (labels, vectors)."""
    if len(labels) == 0:
        return [Hits() for _ in range(len(queries))]
    sims = queries @ vectors.T  # [n_queries, n_vectors]
    out = []
    for row in sims:
        s, i = top_k(row, labels, k)
        out.append(Hits(i, s))
    return out


def merge_hits(parts: list[list[Hits]], k: int) -> list[Hits]:
    """Merge per-block results (same queries) into one top-k per query."""
    merged = []
    for per_query in zip(*parts, strict=True):
        ids = np.concatenate([h.ids for h in per_query])
        scores = np.concatenate([h.scores for h in per_query])
        s, i = top_k(scores, ids, k)
        merged.append(Hits(i, s))
    return merged


def unpad(scores: npt.NDArray[np.float32], labels: npt.NDArray[np.int64]) -> list[Hits]:
    """faiss and friends mark a missing result with label -1; drop those."""
    if labels.size == 0 or labels.min() >= 0:  # nothing missing: rows as they are
        labels = labels.astype(np.int64, copy=False)
        scores = scores.astype(np.float32, copy=False)
        return [Hits(labels[i], scores[i]) for i in range(labels.shape[0])]
    out = []
    for s_row, l_row in zip(scores, labels, strict=True):
        keep = l_row >= 0
        out.append(
            Hits(
                np.ascontiguousarray(l_row[keep], dtype=np.int64),
                np.ascontiguousarray(s_row[keep], dtype=np.float32),
            )
        )
    return out


def auto_ef_search(n_vectors: int) -> int:
    """HNSW's candidate list when a collection has not set one: 128 up to 100k vectors, then
    growing as n^0.7, because a denser graph needs a longer walk for the same recall
    (bench/search.py sweeps ef_search at 25k vectors and at a synthetic 1M; the runs that chose
    these numbers are in docs/decisions.md); capped at 1024. A few hundred candidates cost less
    than embedding the query; `rag tune` finds the cheapest setting per collection."""
    if n_vectors <= 100_000:
        return 128
    return min(1024, int(round(128 * (n_vectors / 100_000) ** 0.7)))


class RWLock:
    """Many readers or one writer. Writers are preferred so a steady stream of searches
    cannot starve catch-up. The context managers are plain objects (no generator per use):
    this lock sits on every search's hot path."""

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._readers = 0
        self._writer = False
        self._waiting_writers = 0
        self._read = _Held(self._acquire_read, self._release_read)
        self._write = _Held(self._acquire_write, self._release_write)

    def read(self) -> _Held:
        return self._read

    def write(self) -> _Held:
        return self._write

    def _acquire_read(self) -> None:
        with self._cond:
            while self._writer or self._waiting_writers:
                self._cond.wait()
            self._readers += 1

    def _release_read(self) -> None:
        with self._cond:
            self._readers -= 1
            if not self._readers and self._waiting_writers:
                self._cond.notify_all()

    def _acquire_write(self) -> None:
        with self._cond:
            self._waiting_writers += 1
            while self._writer or self._readers:
                self._cond.wait()
            self._waiting_writers -= 1
            self._writer = True

    def _release_write(self) -> None:
        with self._cond:
            self._writer = False
            self._cond.notify_all()


class _Held:
    __slots__ = ("_enter", "_exit")

    def __init__(self, enter: Callable[[], None], exit_: Callable[[], None]) -> None:
        self._enter, self._exit = enter, exit_

    def __enter__(self) -> None:
        self._enter()

    def __exit__(self, *exc: object) -> None:
        self._exit()


META_FILE = "meta.json"
FORMAT_VERSION = 1


def write_meta(path: Path, kind: str, dim: int, params: dict[str, Any], **extra: Any) -> None:
    meta = {"format": FORMAT_VERSION, "kind": kind, "dim": dim, "params": params, **extra}
    (path / META_FILE).write_text(json.dumps(meta, sort_keys=True))


def read_meta(path: Path, kind: str) -> dict[str, Any]:
    meta: dict[str, Any] = json.loads((path / META_FILE).read_text())
    if meta.get("format") != FORMAT_VERSION or meta.get("kind") != kind:
        raise Invalid(f"{path} holds a {meta.get('kind')!r} index, format {meta.get('format')}")
    return meta
