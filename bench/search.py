"""Retrieval benchmark: the figures of issue 3 except retrieval quality (bench/quality.py).

    python bench/search.py [--quick] [--large N] [--queries N] [--http-chunks N]
                            [--query-format auto|float32|int8] ...

1. recall@10 against queries/s for every index kind and knob setting, at the 24,576 real
   MiniLM vectors and at a large synthetic set (1M; `--quick`: 100k), single queries, one thread;
2. the index layer's overhead: `index.search` against the bare hnswlib / faiss call on the same
   index object at the same knobs, single queries, in alternating passes (ratio of medians);
3. `POST /v1/collections/{id}/search` over real HTTP (uvicorn on loopback) on a SQLite
   collection of 100k chunks (`--quick`: 25k), query embedding included: p50, p99, recall@10
   against exact search over the same rows;
4. chromadb (embedded, default HNSW settings) on the same corpus and query vectors, timed
   interleaved with ragserve in process: index alone, vector in / texts out (the figure), and
   with the shared embedder included.

Figures 3 and 4 are in bench/_search_http.py. Ends with, one per line: FIGURE
recall_at_10_default, FIGURE index_overhead_ratio, FIGURE search_http_p99_ms, FIGURE
chroma_p99_over_ours.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import io
import logging
import os
import pstats
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._data import (  # noqa: E402
    F32,
    I64,
    exact_topk,
    load_real,
    percentile,
    recall_at_k,
    synthesize,
    table,
    time_each,
)
from bench._search_http import K, http_and_chroma  # noqa: E402
from rag.index import Hits, Knobs, VectorIndex, build_index, default_kind_for  # noqa: E402

log = logging.getLogger("bench.search")

# (kind, build params, knob settings); a knob dict of {} is the index's own default.
SWEEP: list[tuple[str, dict[str, Any], list[dict[str, Any]]]] = [
    ("exact", {}, [{}]),
    ("faiss_flat", {"use_gpu": False}, [{}]),
    ("hnsw", {}, [{"ef_search": e} for e in (16, 32, 40, 128, 256)] + [{}]),
    ("faiss_hnsw", {}, [{"ef_search": e} for e in (16, 32, 40, 128, 256)] + [{}]),
    ("faiss_ivf", {"use_gpu": False}, [{"nprobe": p} for p in (4, 8, 16, 32, 64, 128)] + [{}]),
    ("faiss_ivf_sq8", {"use_gpu": False}, [{"nprobe": p} for p in (8, 32, 128)] + [{}]),
]
QUICK_KNOBS = {"hnsw": [{"ef_search": 32}, {}], "faiss_hnsw": [{"ef_search": 32}, {}]}
BRUTE_KINDS = ("exact", "faiss_flat")


@contextmanager
def faiss_threads(n: int) -> Iterator[None]:
    import faiss

    old = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(n)
    try:
        yield
    finally:
        faiss.omp_set_num_threads(old)


def build(kind: str, params: dict[str, Any], vectors: F32) -> tuple[VectorIndex, float]:
    """Build with every core (as the service's rebuild does), in 50k batches."""
    index = build_index(kind, vectors.shape[1], params)
    t = time.perf_counter()
    with faiss_threads(os.cpu_count() or 1):
        step = 50_000
        for start in range(0, len(vectors), step):
            ids = np.arange(start, min(start + step, len(vectors)), dtype=np.int64)
            index.add(ids, vectors[start : start + step])
    return index, time.perf_counter() - t


def _one(index: VectorIndex, queries: F32, sp: Knobs, i: int) -> list[Hits]:
    return index.search(queries[i : i + 1], sp)


def _ours(index: VectorIndex, sp: Knobs, x: F32) -> list[Hits]:
    return index.search(x, sp)


def knob_label(knobs: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in knobs.items()) or "default"


# ------------------------------------------------------------------ figure 1


@dataclass
class SweepRow:
    size: int
    kind: str
    knobs: str
    default: bool
    recall: float
    qps: float
    p50_us: float
    p99_us: float
    build_s: float


def sweep(
    size: int,
    vectors: F32,
    queries: F32,
    gt: I64,
    *,
    quick: bool,
    brute_queries: int,
    keep: tuple[str, ...] = (),
) -> tuple[list[SweepRow], dict[str, VectorIndex]]:
    """Recall@10 and single-query throughput (one thread) for every kind and knob."""
    rows: list[SweepRow] = []
    kept: dict[str, VectorIndex] = {}
    default_kind = default_kind_for(size)
    for kind, params, knob_list in SWEEP:
        if quick:
            knob_list = QUICK_KNOBS.get(kind, [{}])
        try:
            index, build_s = build(kind, params, vectors)
        except MemoryError:
            print(f"<!-- {kind} at {size}: out of memory, skipped -->", flush=True)
            continue
        n_q = min(len(queries), brute_queries) if kind in BRUTE_KINDS else len(queries)
        for knobs in knob_list:
            sp = Knobs(k=K, **knobs)
            with faiss_threads(1):
                index.search(queries[:1], sp)  # warm: ef set, pages touched
                times, hits = time_each(partial(_one, index, queries, sp), n_q)
            found = [h[0].ids.tolist() for h in hits]
            row = SweepRow(
                size=size,
                kind=kind,
                knobs=knob_label(knobs),
                default=(kind == default_kind and not knobs),
                recall=recall_at_k(found, gt[:n_q], K),
                qps=1000.0 * n_q / sum(times),
                p50_us=1000.0 * percentile(times, 50),
                p99_us=1000.0 * percentile(times, 99),
                build_s=build_s,
            )
            rows.append(row)
            print(
                f"  {size:>8} {kind:<14} {row.knobs:<16} recall@10 {row.recall:.3f} "
                f"{row.qps:8.0f} q/s",
                flush=True,
            )
        if kind in keep:
            kept[kind] = index
        else:
            del index
            gc.collect()
    return rows, kept


def print_sweep(rows: list[SweepRow]) -> str:
    md = table(
        ["vectors", "kind", "knobs", "recall@10", "q/s", "p50 µs", "p99 µs", "build s"],
        [
            (
                r.size,
                r.kind + (" **(service default)**" if r.default else ""),
                r.knobs,
                r.recall,
                r.qps,
                r.p50_us,
                r.p99_us,
                r.build_s,
            )
            for r in rows
        ],
    )
    print(md, flush=True)
    return md


# ------------------------------------------------------------------ figure 2


def bare_call(kind: str, index: Any, knobs: dict[str, Any]) -> Callable[[F32], Any] | None:
    """The library's own search on the very index object ours wraps, at the same knobs.
    Reaches into the backend's private attribute on purpose: same data, same graph."""
    if kind == "hnsw":
        lib = index._index
        ef = max(knobs.get("ef_search") or index.default_ef_search(), K)
        lib.set_ef(ef)
        index._ef = ef  # keep our wrapper's view of the index-wide ef consistent
        return lambda x: lib.knn_query(x, k=K, num_threads=1)
    if kind == "faiss_hnsw":
        lib = index._index
        lib.hnsw.efSearch = max(knobs.get("ef_search") or index.default_ef_search(), K)
        return lambda x: lib.search(x, K)
    if kind in ("faiss_ivf", "faiss_ivf_sq8"):
        lib = index._ivf
        if lib is None:
            return None
        lib.nprobe = knobs.get("nprobe") or index.default_nprobe()
        return lambda x: lib.search(x, K)
    if kind == "faiss_flat":
        lib = index._index
        return lambda x: lib.search(x, K)
    return None


def interleaved(
    fns: dict[str, Callable[[F32], Any]], queries: F32, rounds: int = 8
) -> dict[str, list[float]]:
    """Per-call µs of each function on the same single queries, in alternating passes: a pass
    runs one function over every query, and the next pass runs another (the order rotates
    per round). Each call then finds the caches as a service's next query does, warmed by a
    different query, never by the same query a moment before; running the sides back to back
    on one query let whichever went second ride on the first one's caches, and the medians
    of that mix (half warm, half cold) moved between runs by more than the overhead itself
    (docs/decisions.md, 2026-11-30)."""
    names = list(fns)
    out: dict[str, list[float]] = {n: [] for n in names}
    for fn in fns.values():
        fn(queries[:1])
    for r in range(rounds):
        shift = r % len(names)
        for name in names[shift:] + names[:shift]:
            fn = fns[name]
            times = out[name]
            for i in range(len(queries)):
                x = queries[i : i + 1]
                t = time.perf_counter_ns()
                fn(x)
                times.append((time.perf_counter_ns() - t) / 1000.0)
    return out


def overhead(
    indexes: dict[str, VectorIndex], queries: F32
) -> tuple[list[tuple[Any, ...]], float, str]:
    cases: list[tuple[str, dict[str, Any]]] = [
        ("hnsw", {"ef_search": 40}),
        ("hnsw", {}),
        ("faiss_hnsw", {"ef_search": 40}),
        ("faiss_ivf", {}),
        ("faiss_flat", {}),
    ]
    rows: list[tuple[Any, ...]] = []
    worst = 0.0
    for kind, knobs in cases:
        index = indexes.get(kind)
        if index is None:
            continue
        bare = bare_call(kind, index, knobs)
        if bare is None:
            continue
        sp = Knobs(k=K, **knobs)
        with faiss_threads(1):
            t = interleaved({"ours": partial(_ours, index, sp), "bare": bare}, queries)
        ours, lib = percentile(t["ours"], 50), percentile(t["bare"], 50)
        ratio = ours / lib
        worst = max(worst, ratio)
        rows.append((kind, knob_label(knobs), ours, lib, ours - lib, ratio))
    md = table(["kind", "knobs", "ours p50 µs", "bare p50 µs", "extra µs", "ratio"], rows)
    print(md, flush=True)
    return rows, worst, md


def hnsw_breakdown(index: Any, queries: F32, profile: bool) -> str:
    """Where the hnsw wrapper's extra time goes, layer by layer (interleaved medians)."""
    sp = Knobs(k=K, ef_search=40)
    lib = index._index
    index.search(queries[:1], sp)
    fns = {
        "knn_query(x, k, num_threads=1)": lambda x: lib.knn_query(x, k=K, num_threads=1),
        "knn_query(..., filter=None)": lambda x: lib.knn_query(x, k=K, num_threads=1, filter=None),
        "HnswIndex._query (+ Hits)": lambda x: index._query(x, K, 40, None),
        "HnswIndex.search (+ lock, checks)": lambda x: index.search(x, sp),
    }
    t = interleaved(fns, queries)
    base = percentile(next(iter(t.values())), 50)
    md = table(
        ["layer", "p50 µs", "over bare µs"],
        [(n, percentile(v, 50), percentile(v, 50) - base) for n, v in t.items()],
    )
    print(md, flush=True)
    if profile:
        prof = cProfile.Profile()
        prof.enable()
        for i in range(len(queries)):
            index.search(queries[i : i + 1], sp)
        prof.disable()
        buf = io.StringIO()
        pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(12)
        print("```\n" + buf.getvalue().strip() + "\n```", flush=True)
    return md


# ------------------------------------------------------------------ main


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="a few minutes on 2 cores")
    ap.add_argument("--large", type=int, help="synthetic set size (1M; --quick 100k; 0 skips)")
    ap.add_argument("--queries", type=int, help="queries per setting (1000; --quick 200)")
    ap.add_argument("--brute-queries", type=int, default=100, help="queries for exact kinds")
    ap.add_argument("--http-chunks", type=int, help="chunks behind /search (100k; --quick 25k)")
    ap.add_argument("--http-queries", type=int, help="HTTP queries (1000)")
    ap.add_argument("--no-chroma", action="store_true")
    ap.add_argument("--profile", action="store_true", help="cProfile the hnsw wrapper")
    ap.add_argument("--out", type=Path, help="also write the markdown tables here")
    ap.add_argument(
        "--query-format",
        default="auto",
        choices=["auto", "float32", "int8"],
        help="what embeds the HTTP run's queries (RAG_EMBED__ADVANCED__QUERY_FORMAT; auto is int8)",
    )
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)

    large = args.large if args.large is not None else (100_000 if args.quick else 1_000_000)
    n_queries = args.queries or (200 if args.quick else 1000)
    http_chunks = args.http_chunks or (25_000 if args.quick else 100_000)
    # 1,000 even in --quick: the p99 of 200 is the second-worst request, one stall decides it.
    http_queries = args.http_queries or 1000
    sections: list[str] = []

    real = load_real()
    queries = real.queries[:n_queries]
    print(f"## recall@10 against queries/s ({n_queries} queries, one thread)\n", flush=True)
    keep = ("hnsw", "faiss_hnsw", "faiss_ivf", "faiss_flat")
    rows, kept = sweep(
        len(real.passages),
        real.passages,
        queries,
        real.gt,
        quick=False,
        brute_queries=args.brute_queries,
        keep=keep,
    )
    defaults = [r.recall for r in rows if r.default]

    print("\n## index layer overhead (ours / bare library, same index, interleaved)\n")
    _, worst, md2 = overhead(kept, queries)
    sections.append(md2)
    if "hnsw" in kept:
        print("\nhnsw wrapper, layer by layer (ef_search=40):\n")
        sections.append(hnsw_breakdown(kept["hnsw"], queries, args.profile))
    kept.clear()
    gc.collect()

    if large:
        print(f"\n  synthesising {large} vectors and their exact top-{K} ...", flush=True)
        t = time.perf_counter()
        big, _ = synthesize(real.passages, large, seed=0)
        with faiss_threads(os.cpu_count() or 1):
            gt_big = exact_topk(big, queries, K)
        print(f"  done in {time.perf_counter() - t:.1f} s", flush=True)
        big_rows, _ = sweep(
            large, big, queries, gt_big, quick=args.quick, brute_queries=args.brute_queries
        )
        rows += big_rows
        defaults += [r.recall for r in big_rows if r.default]
        del big
        gc.collect()
    print()
    sections.insert(0, print_sweep(rows))

    print(
        f"\n## /search over HTTP at {http_chunks} chunks ({http_queries} queries,"
        f" query format {args.query_format})\n",
        flush=True,
    )
    lat, stages = http_and_chroma(
        real,
        http_chunks,
        http_queries,
        with_chroma=not args.no_chroma,
        query_format=args.query_format,
    )
    md4 = table(
        ["system", "p50 ms", "p99 ms", "mean ms", "recall@10", "note"], [x.row() for x in lat]
    )
    print(md4)
    print(
        "\nserver-side stage medians (ms): " + ", ".join(f"{k} {v:.2f}" for k, v in stages.items())
    )
    sections.append(md4)
    if args.out:
        args.out.write_text("\n\n".join(sections) + "\n")

    ours = next(x for x in lat if x.name.startswith("ragserve POST"))
    ours_known = next(x for x in lat if "search path (in process, precomputed" in x.name)
    chroma_docs = next(
        (x for x in lat if x.name.startswith("chromadb") and "vector, with" in x.name), None
    )
    print()
    print(f"FIGURE recall_at_10_default {min(defaults):.3f}")
    print(f"FIGURE index_overhead_ratio {worst:.2f}")
    print(f"FIGURE search_http_p99_ms {ours.p99:.2f}")
    # Like for like: both in process, vector in, top 10 with their texts out (the embedder is
    # one shared object; the pair that includes it is in the table).
    ratio = chroma_docs.p99 / ours_known.p99 if chroma_docs else float("nan")
    print(f"FIGURE chroma_p99_over_ours {ratio:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
