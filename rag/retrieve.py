"""Search, top to bottom: embed → vector search → keyword search → fuse → hydrate.

Hybrid search fuses by score, not rank: each side's scores become z-scores over the
candidates, and `hybrid` is the keyword side's weight in their convex combination (`fuse`).

Every hit is re-checked against SQL (tenant, collection, tombstone) before it is returned,
so an index that lags the record can never leak a deleted or foreign chunk. A deadline is
passed down the stages; when what is left of it cannot cover a stage at the requested knobs,
the stage is degraded (smaller ef_search or nprobe, no keyword side) and the answer says so.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from rag.config import SearchSettings
from rag.db import Database, chunks, collections
from rag.db.fulltext import keyword_search
from rag.deadline import Deadline
from rag.embed import Embedder
from rag.errors import Invalid, NotFound
from rag.index.base import Hits
from rag.index.filters import Where, matches
from rag.index.manager import IndexManager, IndexState
from rag.knobs import Knobs

log = logging.getLogger(__name__)

# The keyword weight that did best on docfaq (bench/quality.py: chosen on the even-numbered
# half of its queries, and ahead of dense on the other half too); heavier weights fall below
# dense on that set. What `rag eval --choose-hybrid`
# tries first; searches stay dense (0) unless a request or the collection sets it.
SUGGESTED_HYBRID = 0.15


# What a search restricts itself to: the index's filter language (rag.index.filters).
Filter = Where


@dataclass(frozen=True)
class Passage:
    chunk_id: int
    document_id: str
    filename: str
    ordinal: int
    text: str
    start_char: int
    end_char: int
    score: float
    dense_score: float | None
    keyword_score: float | None
    metadata: dict[str, Any]
    # What clients see as its id: a hash of its document and span. The row id is a counter
    # shared by every tenant, so showing it would tell how much the others ingest.
    uid: str = ""


@dataclass
class SearchResult:
    passages: list[Passage]
    knobs: Knobs  # the values used: the request's, the collection's, the index's defaults
    timings_ms: dict[str, float]
    degraded: list[str]
    index: IndexState
    partial: bool  # the index is still building or catching up: results cover what is indexed
    over_budget: bool = False
    # The collection's saved defaults as stored (search knobs and the answer's, e.g. kv_reuse).
    saved: dict[str, Any] = field(default_factory=dict)
    # The query's embedding [dim] (unit length): what answer records keep for drift.
    query_vector: npt.NDArray[np.float32] | None = None

    def knobs_used(self) -> dict[str, Any]:
        """The knobs as a response reports them, with the index kind that served them."""
        return {**self.knobs.as_dict(drop_unset=False), "index_kind": self.index.kind}


@dataclass
class _Cost:
    """Running estimates of stage costs, for the budget decisions."""

    per_unit_ms: float = 0.02  # vector search ms per unit of effort (ef, nprobe, ...)
    keyword_ms: float = 5.0
    hydrate_ms: float = 2.0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def observe(self, attr: str, value: float) -> None:
        with self.lock:
            old = getattr(self, attr)
            setattr(self, attr, 0.8 * old + 0.2 * value)


class Retriever:
    def __init__(
        self, db: Database, embedder: Embedder, indexes: IndexManager, settings: SearchSettings
    ) -> None:
        self.db = db
        self.embedder = embedder
        self.indexes = indexes
        self.settings = settings
        self._costs: dict[str, _Cost] = {}

    # ------------------------------------------------------------------ the path

    def search(
        self,
        tenant_id: str,
        collection_id: str,
        query: str,
        knobs: Knobs,
        filt: Filter | None = None,
        deadline: Deadline | None = None,
        hybrid_default: float = 0.0,
    ) -> SearchResult:
        """The passages for `query`; `hybrid_default` is the keyword weight when neither
        `knobs` nor the collection's saved defaults set one (the ask path's differs)."""
        timings: dict[str, float] = {}
        degraded: list[str] = []
        with self.db.connect() as conn:
            saved = collections.saved_defaults(conn, tenant_id, collection_id)
        if saved is None:
            raise NotFound(f"collection {collection_id} not found")
        k, ef, nprobe, exact, hybrid, budget_ms = self._resolve(saved, query, knobs, hybrid_default)
        allowed = None
        where: Where | None = None
        if filt is not None and not filt.empty:
            if not hybrid and self.indexes.filters_inside(collection_id):
                # The index evaluates the filter itself (Milvus): no id list resolved in
                # SQL, which at millions of matching chunks would cost more than the search;
                # the hydrated rows are checked against the filter below.
                where = filt
                with self.db.read() as session:
                    chunks.metadata_keys_known(session, collection_id, filt.metadata)
            else:
                with self.db.read() as session:
                    allowed = chunks.allowed_ids(
                        session, collection_id, filt.document_ids, filt.metadata
                    )
        deadline = deadline or Deadline.after_ms(budget_ms)
        cost = self._costs.setdefault(collection_id, _Cost())
        # A few spare candidates absorb hits that the SQL re-check drops.
        fetch = min(k + 5, self.settings.max_k + 5)

        t = time.perf_counter()
        qvec = self.embedder.embed([query], deadline)
        timings["embed"] = _ms(t)

        index_state = self.indexes.state(collection_id)
        effort_param, effort = self._effort(index_state, ef, nprobe, exact)
        if deadline.bounded:
            spare = deadline.remaining_ms() - cost.hydrate_ms - (cost.keyword_ms if hybrid else 0)
            if exact and effort * cost.per_unit_ms > spare:
                exact = False
                degraded.append("exact search replaced by the index's approximate search")
                effort_param, effort = self._effort(index_state, ef, nprobe, False)
            if effort_param and effort * cost.per_unit_ms > spare:
                floor = k if effort_param == "ef_search" else 1
                cut = max(floor, int(spare / cost.per_unit_ms))
                if cut < effort:
                    degraded.append(f"{effort_param} lowered from {effort} to {cut}")
                    effort = cut
                    if effort_param == "ef_search":
                        ef = cut
                    else:
                        nprobe = cut

        t = time.perf_counter()
        outcome = self.indexes.search(
            collection_id,
            qvec,
            Knobs(
                k=fetch,
                ef_search=ef,
                nprobe=nprobe,
                exact=bool(exact),
                # What is left of the budget: an index behind a network call (Milvus) uses
                # it as the call's timeout.
                budget_ms=max(deadline.remaining_ms(), 1.0) if deadline.bounded else None,
            ),
            allowed_ids=allowed,
            where=where,
        )
        timings["search"] = _ms(t)
        if effort:
            cost.observe("per_unit_ms", timings["search"] / effort)
        hits: Hits = outcome.hits[0]

        keyword: list[tuple[int, float]] = []
        if hybrid:
            if deadline.bounded and deadline.remaining_ms() < cost.keyword_ms + cost.hydrate_ms:
                degraded.append("keyword search skipped to stay within the budget")
                hybrid = 0.0
            else:
                t = time.perf_counter()
                with self.db.read() as session:
                    keyword = keyword_search(session, collection_id, query, fetch * 2, allowed)
                timings["keyword"] = _ms(t)
                cost.observe("keyword_ms", timings["keyword"])

        t = time.perf_counter()
        cosines = self._cosines(collection_id, qvec[0], hits, keyword) if keyword else {}
        ranked = fuse(hits, keyword, hybrid or 0.0, fetch, cosines)
        timings["fuse"] = _ms(t)

        t = time.perf_counter()
        passages = self._hydrate(tenant_id, collection_id, ranked)
        if where is not None:
            passages = [p for p in passages if matches(where, p.document_id, p.metadata)]
        passages = passages[:k]
        timings["hydrate"] = _ms(t)
        cost.observe("hydrate_ms", timings["hydrate"])
        timings["total"] = deadline.elapsed_ms()

        state = outcome.state
        used = Knobs(
            k=k,
            # The values the index actually used: the request's, or the index's defaults.
            ef_search=max(effort, k) if effort_param == "ef_search" and not exact else None,
            nprobe=effort if effort_param == "nprobe" and not exact else None,
            exact=bool(exact),
            hybrid=hybrid or 0.0,
            budget_ms=budget_ms,
        )
        return SearchResult(
            passages,
            used,
            timings,
            degraded,
            state,
            partial=state.building or state.stale,
            over_budget=deadline.expired(),
            saved=saved,
            query_vector=qvec[0],
        )

    # ------------------------------------------------------------------ pieces

    def _resolve(
        self, saved: dict[str, Any], query: str, knobs: Knobs, hybrid_default: float = 0.0
    ) -> tuple[int, int | None, int | None, bool, float, float | None]:
        """The knobs in force: the request's, else the collection's saved defaults (`saved`),
        else the service's."""
        if not query.strip():
            raise Invalid("query is empty")
        if len(query) > self.settings.max_query_chars:
            raise Invalid(f"query is longer than {self.settings.max_query_chars} characters")

        given = knobs.over(Knobs.from_dict(saved))

        def pick(name: str, default: Any) -> Any:
            value = getattr(given, name)
            return value if value is not None else default

        k = int(pick("k", self.settings.default_k))
        if not 1 <= k <= self.settings.max_k:
            raise Invalid(f"k must be between 1 and {self.settings.max_k}, got {k}")
        ef = pick("ef_search", None)
        if ef is not None and ef < k:
            raise Invalid(f"ef_search ({ef}) must be at least k ({k})")
        nprobe = pick("nprobe", None)
        hybrid = float(pick("hybrid", hybrid_default))
        if not 0.0 <= hybrid <= 1.0:
            raise Invalid("hybrid is the keyword weight, between 0 and 1")
        budget = pick("budget_ms", self.settings.default_budget_ms)
        return k, ef, nprobe, bool(pick("exact", False)), hybrid, budget

    def _effort(
        self, state: IndexState, ef: int | None, nprobe: int | None, exact: bool
    ) -> tuple[str | None, int]:
        """Which knob sets the search's cost, and its value (for the budget)."""
        index = self.indexes.get(state.collection_id)
        knob = None if exact else index.effort_knob
        if knob is None:  # an exact scan: its cost follows the count
            return None, max(1, state.count // 100)
        if knob == "ef_search":
            return knob, int(ef or index.default_ef_search())
        return knob, int(nprobe or index.params.get("nprobe") or index.default_nprobe())

    def _cosines(
        self,
        collection_id: str,
        qvec: npt.NDArray[np.float32],
        dense: Hits,
        keyword: list[tuple[int, float]],
    ) -> dict[int, float]:
        """The query's cosine with the keyword hits the dense side did not return, from their
        vectors in SQL: fusion then weighs every candidate on both sides."""
        seen = {int(i) for i in dense.ids}
        missing = [c for c, _ in keyword if c not in seen]
        if not missing:
            return {}
        with self.db.read() as session:
            ids, vectors = chunks.vectors_of(
                session, collection_id, self.embedder.model_id, self.embedder.dim, missing
            )
        return {int(i): float(s) for i, s in zip(ids, vectors @ qvec, strict=True)}

    def _hydrate(
        self,
        tenant_id: str,
        collection_id: str,
        ranked: list[tuple[int, float, float | None, float | None]],
    ) -> list[Passage]:
        if not ranked:
            return []
        with self.db.connect() as conn:
            by_id = chunks.hydrate(conn, tenant_id, collection_id, [r[0] for r in ranked])
        out = []
        for chunk_id, score, dense, kw in ranked:
            row = by_id.get(chunk_id)
            if row is None:
                continue  # deleted, or never this tenant's: the index lags the record
            out.append(
                Passage(
                    row.id,
                    row.document_id,
                    row.filename,
                    row.ordinal,
                    row.text,
                    row.start_char,
                    row.end_char,
                    score,
                    dense,
                    kw,
                    row.meta or {},
                    row.uid,
                )
            )
        return out


def fuse(
    dense: Hits,
    keyword: list[tuple[int, float]],
    weight: float,
    limit: int,
    cosines: dict[int, float] | None = None,
) -> list[tuple[int, float, float | None, float | None]]:
    """Dense and keyword candidates ranked by a convex combination of their z-scores:
    (1 - weight) * z(cosine) + weight * z(BM25). With weight 0, or no keyword hits, the dense
    ranking and its cosine scores pass through unchanged.

    Why scores and not ranks: on docfaq weighted reciprocal-rank fusion was below dense at
    every weight (bench/quality.py's reciprocal-rank rows), since it promotes the keyword side's
    top hits however weak their match; z-scores keep each side's own margins. The dense z is
    taken over every candidate, with the cosine of keyword-only hits from `cosines` (the
    lowest dense cosine when one is not known); the keyword z over the keyword hits, and a
    candidate the keyword search did not return counts as its lowest hit (one unit below them
    when all hits score alike). Returns (chunk id, fused score, cosine, BM25 score or None).
    """
    dense_scores = {int(i): float(s) for i, s in dense}
    if weight <= 0 or not keyword:
        return [(i, s, s, None) for i, s in list(dense_scores.items())[:limit]]
    kw_scores = dict(keyword)
    cosine = {**(cosines or {}), **dense_scores}
    candidates = list(dict.fromkeys([*dense_scores, *kw_scores]))  # dense order breaks ties
    lowest = min(cosine.values(), default=0.0)
    dense_z = _z(np.array([cosine.get(c, lowest) for c in candidates]))
    hit_z = _z(np.array(list(kw_scores.values())))
    kw_z = dict(zip(kw_scores, hit_z.tolist(), strict=True))
    floor = float(hit_z.min()) - (1.0 if not hit_z.any() else 0.0)
    keyword_z = np.array([kw_z.get(c, floor) for c in candidates])
    fused = (1 - weight) * dense_z + weight * keyword_z
    best = [candidates[j] for j in np.argsort(-fused, kind="stable")[:limit].tolist()]
    score = dict(zip(candidates, fused.tolist(), strict=True))
    return [(c, score[c], cosine.get(c), kw_scores.get(c)) for c in best]


def _z(values: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """Standard scores; all zeros when the values do not spread."""
    spread = float(values.std())
    return (values - values.mean()) / spread if spread > 0 else np.zeros_like(values)


def _ms(t0: float) -> float:
    return round((time.perf_counter() - t0) * 1000.0, 3)
