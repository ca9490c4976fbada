"""Data and measuring helpers shared by the search benchmark.

The real vectors are ../shared/data/vectors (24,576 all-MiniLM-L6-v2 passage vectors, 1,000
query vectors and their exact top-100). Larger corpora are synthesised from them: each vector
is a real passage vector mixed with a little of another one plus Gaussian noise, re-normalised,
so the set keeps the clustered shape of real sentence embeddings instead of being uniform noise.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

# The data sets live beside the checkout, in ../shared/data (never downloaded).
SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"
VECTORS = SHARED / "vectors"


def shared(*parts: str) -> Path:
    """A path under ../shared/data, or exit saying where it was looked for: a benchmark never
    runs on stand-in data without saying so."""
    path = SHARED.joinpath(*parts)
    if not path.exists():
        raise SystemExit(
            f"benchmark data not found: {path} (the benches read ../shared/data beside the "
            "checkout; see ../shared/ASSETS.md)"
        )
    return path


F32 = npt.NDArray[np.float32]
I64 = npt.NDArray[np.int64]


@dataclass(frozen=True)
class RealSet:
    passages: F32  # [24576, 384], unit rows
    queries: F32  # [1000, 384], unit rows
    gt: I64  # [1000, 100], exact top-100 passage rows by inner product
    passage_texts: list[str]
    query_texts: list[str]


def load_real(root: Path = VECTORS) -> RealSet:
    def texts(name: str) -> list[str]:
        with (root / name).open() as f:
            return [json.loads(line)["text"] for line in f]

    return RealSet(
        passages=np.ascontiguousarray(np.load(root / "passages.f32.npy"), dtype=np.float32),
        queries=np.ascontiguousarray(np.load(root / "queries.f32.npy"), dtype=np.float32),
        gt=np.load(root / "gt_top100.i32.npy").astype(np.int64),
        passage_texts=texts("passages.jsonl"),
        query_texts=texts("queries.jsonl"),
    )


def normalize(x: F32) -> F32:
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    norms[norms == 0] = 1.0
    return (x / norms).astype(np.float32, copy=False)


def synthesize(
    base: F32, n: int, *, mix: float = 0.25, noise: float = 0.35, seed: int = 0
) -> tuple[F32, I64]:
    """`n` unit vectors: row i = normalise(base[j] + w * base[l] + noise * g / sqrt(d)), with
    j, l drawn uniformly, w ~ U(0, mix) and g standard normal. The first len(base) rows are the
    real vectors unchanged. Returns (vectors, source row j of each vector)."""
    rng = np.random.default_rng(seed)
    m, d = base.shape
    out = np.empty((n, d), dtype=np.float32)
    src = np.empty(n, dtype=np.int64)
    head = min(n, m)
    out[:head] = base[:head]
    src[:head] = np.arange(head)
    step = 65_536
    for start in range(head, n, step):
        stop = min(start + step, n)
        j = rng.integers(0, m, stop - start)
        other = rng.integers(0, m, stop - start)
        w = rng.uniform(0.0, mix, (stop - start, 1)).astype(np.float32)
        g = rng.standard_normal((stop - start, d), dtype=np.float32) * (noise / np.sqrt(d))
        out[start:stop] = normalize(base[j] + w * base[other] + g)
        src[start:stop] = j
    return out, src


def exact_topk(vectors: F32, queries: F32, k: int, *, batch: int = 250_000) -> I64:
    """Exact top-k rows by inner product with faiss IndexFlatIP, the corpus in batches
    (bounded memory), merged per query."""
    import faiss

    best_s = np.full((len(queries), k), -np.inf, dtype=np.float32)
    best_i = np.full((len(queries), k), -1, dtype=np.int64)
    for start in range(0, len(vectors), batch):
        flat = faiss.IndexFlatIP(vectors.shape[1])
        flat.add(vectors[start : start + batch])
        s, i = flat.search(queries, k)
        s_all = np.concatenate([best_s, s], axis=1)
        i_all = np.concatenate([best_i, np.where(i >= 0, i + start, -1)], axis=1)
        order = np.argsort(-s_all, axis=1, kind="stable")[:, :k]
        best_s = np.take_along_axis(s_all, order, axis=1)
        best_i = np.take_along_axis(i_all, order, axis=1)
    return best_i


def recall_at_k(found: Sequence[Sequence[int]], gt: npt.NDArray[Any], k: int = 10) -> float:
    """Mean |found[:k] ∩ gt[:k]| / k over queries."""
    total = 0
    for row, truth in zip(found, gt, strict=True):
        total += len(set(list(row)[:k]) & set(truth[:k].tolist()))
    return total / (k * len(found)) if len(found) else 0.0


def percentile(samples_ms: Sequence[float], q: float) -> float:
    return float(np.percentile(np.asarray(samples_ms, dtype=np.float64), q)) if samples_ms else 0.0


def time_each(fn: Callable[[int], Any], n: int) -> tuple[list[float], list[Any]]:
    """Call fn(i) for i in range(n), one at a time; per-call milliseconds and results."""
    times: list[float] = []
    results: list[Any] = []
    for i in range(n):
        t = time.perf_counter()
        results.append(fn(i))
        times.append((time.perf_counter() - t) * 1000.0)
    return times, results


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A markdown table; floats get 3 significant decimals."""

    def cell(v: Any) -> str:
        if isinstance(v, float):
            return f"{v:.3f}" if abs(v) < 100 else f"{v:.0f}"
        return str(v)

    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)
