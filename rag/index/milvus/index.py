"""A collection's vectors in a Milvus collection, behind the VectorIndex protocol.

Milvus quirks hidden here: a delete reports the ids it was sent, not the rows that existed;
an HNSW search needs ef >= limit, and a limit above 16,384 is refused; search results are
dicts; a collection swapped out by a rebuild on another replica answers "does not exist" (the
index asks SQL for the current one and retries); a timeout is a gRPC status, not a result.

What differs from the in-process kinds, by design:
- the index lives in Milvus, shared by every replica: no snapshot files (`snapshots` False),
  and one writer at a time (rag.index.milvus.shared);
- `exact` is the index's most thorough search (HNSW: ef up to the row count, IVF: every
  list), not a brute-force pass;
- `len()` is cached for a second (it is a count query in Milvus, and every search reports it).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from rag.errors import Invalid
from rag.index.base import (
    Allowed,
    Attrs,
    Hits,
    Ids,
    Vectors,
    allowed_array,
    as_ids,
    as_vectors,
    auto_ef_search,
)
from rag.index.filters import Where
from rag.index.milvus.engine import (
    INDEX_TYPES,
    MilvusEngine,
    translated,
)
from rag.index.milvus.filters import ID_LIST_MAX, expression, id_list
from rag.index.params import Param
from rag.knobs import Knobs

log = logging.getLogger(__name__)

# Milvus refuses a search limit (and HNSW ef) above this.
LIMIT_MAX = 16_384
_COUNT_TTL_S = 1.0
_ID_BATCH = 4096

# What a bound index asks when its Milvus collection has gone: the current (name, params).
Resolver = Callable[[], tuple[str, dict[str, Any]] | None]


class MilvusIndex:
    kind = "milvus"
    snapshots = False  # the index lives in Milvus: nothing to save or load from files
    shared = True  # one copy for every replica, kept by one writer at a time
    wants_attributes = True  # rows carry their document id and metadata (for filters)
    filters_inside = True  # so `search` takes a `where` and evaluates it in Milvus
    needs_retrain = False  # Milvus trains its own index as segments are sealed
    deleted_count = 0  # a removed row is deleted in Milvus, which compacts it away
    # What it takes, with the bounds __init__ holds them to (rag.index.params; the API checks
    # requests against these before anything is built).
    param_schema: Mapping[str, Param] = {
        "index_type": Param(str, choices=INDEX_TYPES, doc="Milvus's index type"),
        "m": Param(int, 2, 128, doc="HNSW links per node"),
        "ef_construction": Param(int, 1, 4096, doc="HNSW candidate list while building"),
        "nlist": Param(int, 1, 65_536, doc="IVF lists"),
        "ef_search": Param(int, 1, LIMIT_MAX, nullable=True, doc="default HNSW candidates"),
        "nprobe": Param(int, 1, 65_536, nullable=True, doc="default IVF lists scanned"),
    }

    def __init__(
        self,
        dim: int,
        *,
        index_type: str = "HNSW",
        m: int = 16,
        ef_construction: int = 200,
        nlist: int = 128,
        ef_search: int | None = None,
        nprobe: int | None = None,
    ) -> None:
        if index_type not in INDEX_TYPES:
            raise TypeError(f"index_type must be one of {', '.join(INDEX_TYPES)}")
        # Milvus's own bounds (its HNSW takes M 2..2048; ef and nprobe above these only slow
        # the engine every replica shares).
        bounds = {
            "m": (m, 2, 128),
            "ef_construction": (ef_construction, 1, 4096),
            "nlist": (nlist, 1, 65_536),
            "ef_search": (ef_search, 1, LIMIT_MAX),
            "nprobe": (nprobe, 1, 65_536),
        }
        for name, (value, low, high) in bounds.items():
            if value is None and name in ("ef_search", "nprobe"):
                continue
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
                raise TypeError(f"{name} must be an integer between {low} and {high}")
        self.dim = dim
        self.index_type = index_type
        self.m, self.ef_construction, self.nlist = m, ef_construction, nlist
        self.ef_search, self.nprobe = ef_search, nprobe
        self._engine: MilvusEngine | None = None
        self._name: str | None = None
        self._resolve: Resolver | None = None
        self._count: tuple[float, int] | None = None  # (when, rows)
        self._lock = threading.Lock()

    # ---------------------------------------------------------------- binding

    def bind(
        self, engine: MilvusEngine, name: str, *, resolve: Resolver | None = None
    ) -> MilvusIndex:
        """Serve (and write) the Milvus collection `name`, creating it when missing."""
        engine.create(name, self.dim, self.index_type, self.build_params())
        self._engine, self._name, self._resolve = engine, name, resolve
        self._count = None
        return self

    def rebind(self, name: str, params: dict[str, Any]) -> None:
        """Follow a swap made by a rebuild (here or on another replica)."""
        fresh = MilvusIndex(self.dim, **params)
        with self._lock:
            self.index_type, self.m = fresh.index_type, fresh.m
            self.ef_construction, self.nlist = fresh.ef_construction, fresh.nlist
            self.ef_search, self.nprobe = fresh.ef_search, fresh.nprobe
            self._name, self._count = name, None

    @property
    def name(self) -> str | None:
        return self._name

    @property
    def params(self) -> dict[str, Any]:
        return {
            "index_type": self.index_type,
            "m": self.m,
            "ef_construction": self.ef_construction,
            "nlist": self.nlist,
            "ef_search": self.ef_search,
            "nprobe": self.nprobe,
        }

    def build_params(self) -> dict[str, Any]:
        if self.index_type == "HNSW":
            return {"M": self.m, "efConstruction": self.ef_construction}
        if self.index_type.startswith("IVF"):
            return {"nlist": self.nlist}
        return {}

    @property
    def effort_knob(self) -> str | None:
        """Which knob sets a search's cost here (the retriever's budget reads it)."""
        if self.index_type == "HNSW":
            return "ef_search"
        return "nprobe" if self.index_type.startswith("IVF") else None

    def default_ef_search(self) -> int:
        if self.index_type != "HNSW":
            return 0
        return self.ef_search or auto_ef_search(len(self))

    def default_nprobe(self) -> int:
        if not self.index_type.startswith("IVF"):
            return 0
        return self.nprobe or min(self.nlist, 16)

    def nprobe_max(self) -> int:
        return self.nlist if self.index_type.startswith("IVF") else 0

    def _bound(self) -> tuple[MilvusEngine, str]:
        if self._engine is None or self._name is None:
            raise Invalid("this milvus index is not bound to a Milvus collection")
        return self._engine, self._name

    # ---------------------------------------------------------------- writes

    def add(self, ids: Ids, vectors: Vectors, attrs: Attrs | None = None) -> None:
        """Upsert rows: re-adding a live label replaces its vector (and attributes)."""
        ids_arr = as_ids(ids)
        vec_arr = (
            as_vectors(vectors, self.dim) if len(ids_arr) else np.zeros((0, self.dim), np.float32)
        )
        if vec_arr.shape[0] != ids_arr.shape[0]:
            raise Invalid(f"{len(ids_arr)} ids for {vec_arr.shape[0]} vectors")
        if attrs is not None and len(attrs) != len(ids_arr):
            raise Invalid(f"{len(ids_arr)} ids for {len(attrs)} attribute rows")
        if not len(ids_arr):
            return
        if (ids_arr < 0).any():
            raise Invalid("labels must be non-negative")
        # A label repeated within the batch keeps its last vector.
        _, last_rev = np.unique(ids_arr[::-1], return_index=True)
        keep = np.sort(len(ids_arr) - 1 - last_rev)
        engine, name = self._bound()
        batch = engine.settings.write_batch
        rows: list[dict[str, Any]] = []
        for row in keep.tolist():
            document_id, meta = attrs[row] if attrs is not None else ("", {})
            rows.append(
                {
                    "id": int(ids_arr[row]),
                    "vector": vec_arr[row],
                    "document_id": document_id,
                    "meta": meta or {},
                }
            )
            if len(rows) >= batch:
                self._call("upsert", rows)
                rows = []
        if rows:
            self._call("upsert", rows)
        self._count = None

    def remove(self, ids: Ids) -> int:
        """Delete labels; returns how many were live (Milvus itself reports only what it
        was sent, so the live ones are looked up first)."""
        wanted = np.unique(as_ids(ids))
        if not len(wanted):
            return 0
        removed = 0
        for start in range(0, len(wanted), _ID_BATCH):
            block = wanted[start : start + _ID_BATCH].tolist()
            found = self._call("query", filter=id_list(block), output_fields=["id"])
            live = [int(r["id"]) for r in found]
            if live:
                self._call("delete", ids=live)
                removed += len(live)
        if removed:
            self._count = None
        return removed

    def erase(self, ids: Ids) -> int:
        """Remove labels for good: delete, then ask Milvus to compact so that the deleted
        rows leave its segments (Milvus has no tombstones of ours to clear: a removed label
        is already deleted there). Returns how many were live."""
        removed = self.remove(ids)
        self.compact()
        return removed

    def flush(self) -> None:
        """Seal what was written into segments, which Milvus then indexes (after a bulk fill:
        until then a segment is searched by brute force)."""
        self._call("flush")

    def compact(self) -> None:
        """Reclaim deleted rows now (Milvus otherwise compacts on its own schedule)."""
        self.flush()
        self._call("compact")

    def drop(self) -> None:
        engine, name = self._bound()
        engine.drop(name)
        self._count = None

    # ---------------------------------------------------------------- reads

    def __len__(self) -> int:
        cached = self._count
        if cached is not None and time.monotonic() - cached[0] < _COUNT_TTL_S:
            return cached[1]
        if self._engine is None:
            return 0
        rows = self._call("query", filter="", output_fields=["count(*)"])
        n = int(rows[0]["count(*)"]) if rows else 0
        self._count = (time.monotonic(), n)
        return n

    def ids(self) -> Ids:
        out: list[int] = []
        iterator = self._call(
            "query_iterator", batch_size=_ID_BATCH, filter="", output_fields=["id"]
        )
        try:
            while True:
                rows = iterator.next()
                if not rows:
                    break
                out.extend(int(r["id"]) for r in rows)
        finally:
            iterator.close()
        return np.asarray(sorted(set(out)), dtype=np.int64)

    def search(
        self,
        queries: Vectors,
        knobs: Knobs,
        allowed: Allowed | None = None,
        where: Where | None = None,
    ) -> list[Hits]:
        """Top-k per query. `allowed` (chunk ids resolved in SQL) goes into the expression as
        an id list when it is short enough, else the hits are filtered here; `where` goes in
        as far as it maps (the caller applies the rest: see rag.index.filters)."""
        queries = as_vectors(queries, self.dim)
        k = knobs.top_k
        parts: list[str] = []
        post: set[int] | None = None
        if allowed is not None:
            allowed_ids = allowed_array(allowed)
            if not len(allowed_ids):
                return [Hits() for _ in range(len(queries))]
            if len(allowed_ids) <= ID_LIST_MAX:
                parts.append(id_list(allowed_ids.tolist()))
                k = min(k, len(allowed_ids))
            else:
                post = set(allowed_ids.tolist())
        pushed = expression(where)
        if pushed.text:
            parts.append(pushed.text)
        # Over-fetch when hits are filtered after the search (here, or by the caller).
        limit = k if post is None and pushed.complete else min(LIMIT_MAX, 4 * k)
        engine, name = self._bound()
        timeout = knobs.budget_ms / 1000.0 if knobs.budget_ms else engine.settings.search_timeout_s
        filt = " and ".join(f"({p})" for p in parts)
        while True:
            results = self._call(
                "search",
                data=list(queries),
                filter=filt,
                limit=limit,
                output_fields=["id"],
                search_params=self._search_params(knobs, limit),
                timeout=timeout,
            )
            hits = [_hits(row, post, k) for row in results]
            short = post is not None and any(len(h) < k for h in hits)
            if not short or limit >= LIMIT_MAX:
                return hits
            limit = min(LIMIT_MAX, limit * 4)

    def _search_params(self, knobs: Knobs, limit: int) -> dict[str, Any]:
        if self.index_type == "HNSW":
            if knobs.exact:
                ef = min(LIMIT_MAX, max(limit, len(self)))
            else:
                ef = knobs.ef_search or self.default_ef_search()
            return {"metric_type": "IP", "params": {"ef": max(int(ef), limit)}}
        if self.index_type.startswith("IVF"):
            nprobe = self.nlist if knobs.exact else (knobs.nprobe or self.default_nprobe())
            return {"metric_type": "IP", "params": {"nprobe": min(int(nprobe), self.nlist)}}
        return {"metric_type": "IP", "params": {}}

    # ---------------------------------------------------------------- snapshots

    def save(self, path: Path) -> None:
        raise Invalid("a milvus index lives in Milvus: it has no snapshot files")

    @classmethod
    def load(cls, path: Path) -> MilvusIndex:
        raise Invalid("a milvus index lives in Milvus: it has no snapshot files")

    # ---------------------------------------------------------------- calls

    def _call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """client.<method>(<the collection>, ...); a collection swapped out by a rebuild
        elsewhere is followed once. Timeouts and an unreachable engine fail this call only."""
        for attempt in (0, 1):
            engine, name = self._bound()
            try:
                return getattr(engine.client, method)(name, *args, **kwargs)
            except Exception as exc:
                if attempt == 0 and _is_missing(exc) and self._follow():
                    continue
                raise translated(exc, method) from exc
        raise AssertionError("unreachable")

    def _follow(self) -> bool:
        if self._resolve is None:
            return False
        current = self._resolve()
        if current is None or current[0] == self._name:
            return False
        log.info("milvus index %s -> %s (swapped by a rebuild)", self._name, current[0])
        self.rebind(*current)
        return True


def _hits(row: Sequence[dict[str, Any]], post: set[int] | None, k: int) -> Hits:
    ids = np.fromiter((int(h["id"]) for h in row), dtype=np.int64, count=len(row))
    scores = np.fromiter((float(h["distance"]) for h in row), dtype=np.float32, count=len(row))
    if post is not None:
        keep = np.fromiter((i in post for i in ids.tolist()), dtype=bool, count=len(ids))
        ids, scores = ids[keep], scores[keep]
    order = np.lexsort((ids, -scores))[:k]
    return Hits(np.ascontiguousarray(ids[order]), np.ascontiguousarray(scores[order]))


def _is_missing(exc: BaseException) -> bool:
    return getattr(exc, "code", None) == 100 or "does not exist" in str(exc)
