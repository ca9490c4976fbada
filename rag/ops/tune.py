"""`rag tune`: measure recall@k against exact search and latency for a sweep of knobs on a
collection's own data, find the Pareto front, and store the cheapest setting that meets a
target recall within a budget as the collection's default.

Latency is measured through the real search path (embed, index, hydrate), one query at a
time, as a user's request would see it.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np

from rag.db import chunks, collections
from rag.db.models import now
from rag.errors import Invalid, NotFound
from rag.index.base import VectorIndex
from rag.knobs import Knobs
from rag.services import Services

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Point:
    knob: str | None  # "ef_search", "nprobe" or None (exact kinds)
    value: int | None
    recall: float
    p50_ms: float
    p99_ms: float


@dataclass
class TuneReport:
    collection_id: str
    kind: str
    k: int
    queries: int
    target_recall: float
    budget_ms: float | None
    points: list[Point]
    chosen: Point | None
    applied: bool
    measured_at: float | None = None  # set when stored

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["measured_at"] = now()
        return out

    @classmethod
    def from_dict(cls, stored: dict[str, Any], collection_id: str, kind: str) -> TuneReport:
        """A report as `as_dict` stored it for the collection (`kind`: the collection's, where
        none was stored)."""
        points = [_point(p) for p in stored.get("points", [])]
        chosen = _point(stored["chosen"]) if stored.get("chosen") else None
        return cls(
            collection_id=collection_id,
            kind=str(stored.get("kind", kind)),
            k=int(stored.get("k", 10)),
            queries=int(stored.get("queries", 0)),
            target_recall=float(stored.get("target_recall", 0.0)),
            budget_ms=stored.get("budget_ms"),
            points=points,
            # The very point of the sweep, as `table` marks it.
            chosen=next((p for p in points if p == chosen), chosen),
            applied=bool(stored.get("applied", False)),
            measured_at=stored.get("measured_at"),
        )

    def table(self) -> str:
        lines = [
            f"{'knob':>10} {'value':>6} {'recall@' + str(self.k):>10} {'p50 ms':>8} "
            f"{'p99 ms':>8}  pareto"
        ]
        front = set(map(id, pareto(self.points)))
        for p in self.points:
            mark = "*" if id(p) in front else ""
            if self.chosen is p:
                mark += "  <- chosen"
            lines.append(
                f"{p.knob or '-':>10} {p.value if p.value is not None else '-':>6} "
                f"{p.recall:>10.3f} {p.p50_ms:>8.2f} {p.p99_ms:>8.2f}  {mark}"
            )
        return "\n".join(lines)


def pareto(points: list[Point]) -> list[Point]:
    """Points no other point beats on both recall and p99 latency."""
    return [
        p
        for p in points
        if not any(
            q.recall >= p.recall
            and q.p99_ms < p.p99_ms
            or q.recall > p.recall
            and q.p99_ms <= p.p99_ms
            for q in points
        )
    ]


def sweep_values(kind: str, k: int, index: VectorIndex) -> tuple[str | None, list[int | None]]:
    if kind in ("hnsw", "faiss_hnsw"):
        efs = sorted({max(k, v) for v in (8, 16, 24, 32, 48, 64, 96, 128, 256, 512)})
        return "ef_search", list[int | None](efs)
    if kind.startswith("faiss_ivf"):
        nlist = int(index.params.get("nlist") or index.nprobe_max() or 64)
        probes: list[int | None] = [
            v for v in (1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 128) if v <= nlist
        ]
        return "nprobe", probes
    return None, [None]


def sample_queries(services: Services, collection_id: str, n: int, seed: int = 0) -> list[str]:
    """Queries drawn from the collection's own chunks: the first 16 words of a sample."""
    with services.db.read() as s:
        texts = chunks.sample_texts(s, collection_id, n, seed)
    if not texts:
        raise Invalid("the collection has no chunks to tune on")
    return [" ".join(text.split()[:16]) for text in texts]


def read_queries(path: Path) -> list[str]:
    out = []
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line:
            continue
        if line.startswith("{"):
            row = json.loads(line)
            line = str(row.get("text") or row.get("query") or "")
        if line:
            out.append(line)
    if not out:
        raise Invalid(f"{path} holds no queries")
    return out


def tune(
    services: Services,
    collection_id: str,
    *,
    queries: list[str] | None = None,
    n_queries: int = 200,
    k: int = 10,
    target_recall: float = 0.95,
    budget_ms: float | None = None,
    apply: bool = False,
    progress: Callable[[Iterable[Any]], Iterable[Any]] = lambda it: it,
) -> TuneReport:
    with services.db.read() as s:
        collection = collections.get_live(s, collection_id)
        if collection is None:
            raise NotFound(f"collection {collection_id} not found")
        tenant_id = collection.tenant_id
    queries = queries or sample_queries(services, collection_id, n_queries)
    retriever = services.retriever
    # The oracle: exact top-k of every query.
    vectors = services.embedder.embed(queries)
    truth = services.indexes.search(collection_id, vectors, Knobs(k=k, exact=True)).hits
    kind = services.indexes.state(collection_id).kind
    knob, values = sweep_values(kind, k, services.indexes.get(collection_id))
    for q in queries[:5]:  # warm up caches and the cost model
        retriever.search(tenant_id, collection_id, q, Knobs(k=k))
    points = []
    for value in progress(values):
        knobs = Knobs(
            k=k,
            ef_search=value if knob == "ef_search" else None,
            nprobe=value if knob == "nprobe" else None,
            hybrid=0.0,
        )
        latencies, recalls = [], []
        for q, true_hits in zip(queries, truth, strict=True):
            t0 = time.perf_counter()
            result = retriever.search(tenant_id, collection_id, q, knobs)
            latencies.append((time.perf_counter() - t0) * 1000)
            want = set(true_hits.ids.tolist())
            got = {p.chunk_id for p in result.passages}
            recalls.append(len(want & got) / max(1, len(want)))
        points.append(
            Point(
                knob,
                value,
                float(np.mean(recalls)),
                float(np.percentile(latencies, 50)),
                float(np.percentile(latencies, 99)),
            )
        )
    chosen = choose(points, target_recall, budget_ms)
    report = TuneReport(
        collection_id,
        kind,
        k,
        len(queries),
        target_recall,
        budget_ms,
        points,
        chosen,
        applied=False,
    )
    if apply:
        if chosen is None:
            raise Invalid(
                f"no setting reaches recall {target_recall}"
                + (f" within {budget_ms} ms" if budget_ms else "")
            )
        report.applied = True
        store(services, collection_id, report)
    else:
        with services.db.write() as s:
            collections.set_tuning(s, collection_id, report.as_dict(), None)
    return report


def _point(stored: dict[str, Any]) -> Point:
    return Point(**{f.name: stored[f.name] for f in fields(Point)})


def choose(points: list[Point], target_recall: float, budget_ms: float | None) -> Point | None:
    ok = [
        p
        for p in points
        if p.recall >= target_recall and (budget_ms is None or p.p99_ms <= budget_ms)
    ]
    # The cheapest: the smallest knob value that meets the target (latency as tie-break).
    return min(ok, key=lambda p: (p.value or 0, p.p99_ms), default=None)


def store(services: Services, collection_id: str, report: TuneReport) -> None:
    chosen = report.chosen
    assert chosen is not None
    with services.db.write() as s:
        row = collections.get_live(s, collection_id)
        if row is None:
            raise NotFound(f"collection {collection_id} not found")
        defaults = dict(row.search_defaults or {})
        defaults.pop("ef_search", None)
        defaults.pop("nprobe", None)
        if chosen.knob:
            defaults[chosen.knob] = chosen.value
        if report.budget_ms:
            defaults["budget_ms"] = report.budget_ms
        collections.set_tuning(s, collection_id, report.as_dict(), defaults)


def draw(report: TuneReport, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4), dpi=120)
    xs = [p.p99_ms for p in report.points]
    ys = [p.recall for p in report.points]
    ax.plot(xs, ys, "o-", label=f"{report.kind}: p99 latency vs recall@{report.k}")
    for p in report.points:
        if p.value is not None:
            ax.annotate(
                f"{p.knob}={p.value}",
                (p.p99_ms, p.recall),
                fontsize=7,
                xytext=(4, -8),
                textcoords="offset points",
            )
    if report.chosen is not None:
        ax.plot([report.chosen.p99_ms], [report.chosen.recall], "r*", markersize=14, label="chosen")
    ax.axhline(
        report.target_recall,
        color="grey",
        linestyle="--",
        linewidth=0.8,
        label=f"target {report.target_recall}",
    )
    ax.set_xlabel("p99 latency per search (ms)")
    ax.set_ylabel(f"recall@{report.k} vs exact")
    ax.set_title(f"collection {report.collection_id[:8]}: {report.queries} queries")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path
