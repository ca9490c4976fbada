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

Ends with, one per line: FIGURE recall_at_10_default, FIGURE index_overhead_ratio,
FIGURE search_http_p99_ms, FIGURE chroma_p99_over_ours.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import hashlib
import io
import logging
import os
import pstats
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._data import (  # noqa: E402
    F32,
    I64,
    RealSet,
    exact_topk,
    load_real,
    percentile,
    recall_at_k,
    synthesize,
    table,
    time_each,
)
from rag.index import Hits, Knobs, VectorIndex, build_index, default_kind_for  # noqa: E402

log = logging.getLogger("bench.search")

K = 10
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
    of that mix (half warm, half cold) jumped by 10-20 µs between runs."""
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


# ------------------------------------------------------------------ figures 3 and 4


@dataclass
class Corpus:
    vectors: F32
    texts: list[str]
    chunk_ids: I64  # row -> chunk id in SQL
    # The API's opaque chunk ids (the chunk's uid) -> the SQL ids the ground truth uses.
    by_uid: dict[str, int] = field(default_factory=dict)


def load_collection(services: Any, real: RealSet, n: int) -> tuple[str, str, Corpus]:
    """A real SQLite collection of `n` chunks: tenant, key and collection through the service
    layer; documents, chunks and change-log rows inserted directly with precomputed vectors
    (the real passages first, then perturbed copies carrying their source passage's text)."""
    from sqlalchemy import insert, select

    from rag.auth import create_key
    from rag.db import collections
    from rag.db.models import Blob, ChangeLog, Chunk, Document, now

    embedder = services.embedder
    key, tenant_id = create_key(services.db, "bench")
    with services.db.write() as session:
        cid = collections.create(
            session,
            tenant_id,
            name="bench",
            description="search benchmark",
            embedding_model=embedder.model_id,
            embedding_dim=embedder.dim,
            chunk_tokens=200,
            chunk_overlap=32,
            index_kind="auto",
            index_params={},
            search_defaults={},
        ).id
    vectors, src = synthesize(real.passages, n, seed=1)
    texts = [real.passage_texts[j] for j in src.tolist()]
    chunk_ids = np.zeros(n, dtype=np.int64)
    by_uid: dict[str, int] = {}
    per_doc = 500
    for d, start in enumerate(range(0, n, per_doc)):
        stop = min(start + per_doc, n)
        spans, pos = [], 0
        for text in texts[start:stop]:
            spans.append((pos, pos + len(text)))
            pos += len(text) + 2
        body = "\n\n".join(texts[start:stop])
        data = f"bench document {d}\n".encode() + body.encode()
        sha = hashlib.sha256(data).hexdigest()
        with services.db.write() as session:
            t = now()
            session.execute(
                insert(Blob).values(tenant_id=tenant_id, sha256=sha, size=len(data), data=data)
            )
            doc = Document(
                tenant_id=tenant_id,
                collection_id=cid,
                filename=f"bench-{d:05d}.txt",
                media_type="text/plain",
                sha256=sha,
                size=len(data),
                status="indexed",
                meta={},
                text=body,
                chunk_count=stop - start,
                indexed_at=t,
            )
            session.add(doc)
            session.flush()
            session.execute(
                insert(Chunk),
                [
                    {
                        "uid": f"{doc.id}:{o}",
                        "document_id": doc.id,
                        "collection_id": cid,
                        "tenant_id": tenant_id,
                        "ordinal": o,
                        "text": texts[start + o],
                        "start_char": spans[o][0],
                        "end_char": spans[o][1],
                        "token_count": len(texts[start + o].split()),
                        "embedding": vectors[start + o].astype("<f4").tobytes(),
                        "embedding_model": embedder.model_id,
                    }
                    for o in range(stop - start)
                ],
            )
            rows = session.execute(
                select(Chunk.ordinal, Chunk.id, Chunk.uid).where(Chunk.document_id == doc.id)
            ).all()
            ids = [(ordinal, chunk_id) for ordinal, chunk_id, _ in rows]
            for ordinal, chunk_id, uid in rows:
                chunk_ids[start + ordinal] = chunk_id
                by_uid[uid] = chunk_id
            session.execute(
                insert(ChangeLog),
                [
                    {"collection_id": cid, "op": "add", "chunk_id": c, "document_id": doc.id}
                    for _, c in ids
                ],
            )
    return key, cid, Corpus(vectors, texts, chunk_ids, by_uid)


class Server:
    """`rag serve` in its own process on loopback, as deployed: the benchmark's client does
    not share the server's interpreter (and GIL)."""

    def __init__(self, data_dir: Path, admin_key: str) -> None:
        import socket

        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = int(sock.getsockname()[1])
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = {
            **os.environ,
            "RAG_DATA_DIR": str(data_dir),
            "RAG_AUTH__ADMIN_KEY": admin_key,
            "RAG_LOG_LEVEL": "WARNING",
            "RAG_INGEST__IN_PROCESS_WORKER": "false",
        }
        self.proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> Server:
        import httpx

        self.proc = subprocess.Popen(
            [sys.executable, "-m", "rag.cli", "serve", "--port", str(self.port)],
            env=self.env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                httpx.get(f"{self.url}/healthz", timeout=1)
                break
            except httpx.HTTPError:
                time.sleep(0.1)
        else:
            raise RuntimeError("server did not start")
        # The service builds its generator in the background as it starts (both cores for a
        # few seconds): the searches are timed once it is built, as a running service serves
        # them, not against its start-up.
        t = time.monotonic()
        while time.monotonic() < deadline:
            generator = httpx.get(f"{self.url}/readyz", timeout=5).json()["checks"]["generator"]
            if not generator["loading"]:
                print(f"  server up; its generator built {time.monotonic() - t:.1f} s later")
                return self
            time.sleep(0.2)
        raise RuntimeError("the server's generator did not finish loading")

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(timeout=60)


@dataclass
class Latency:
    name: str
    p50: float
    p99: float
    mean: float
    recall: float
    note: str = ""

    def row(self) -> tuple[Any, ...]:
        recall = "-" if np.isnan(self.recall) else self.recall
        return (self.name, self.p50, self.p99, self.mean, recall, self.note)


def latency(name: str, times: list[float], recall: float, note: str = "") -> Latency:
    return Latency(
        name, percentile(times, 50), percentile(times, 99), float(np.mean(times)), recall, note
    )


def _tenant_of(services: Any, cid: str) -> str:
    from rag.db.models import Collection

    with services.db.read() as session:
        row = session.get(Collection, cid)
        assert row is not None
        return str(row.tenant_id)


def http_and_chroma(
    real: RealSet, n_chunks: int, n_queries: int, *, with_chroma: bool, query_format: str = "auto"
) -> tuple[list[Latency], dict[str, float]]:
    import httpx
    from pydantic import SecretStr

    from rag.config import AuthSettings, Settings
    from rag.embed import SentenceTransformerEmbedder
    from rag.services import build_services

    results: list[Latency] = []
    extra: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="ragserve-bench-") as tmp:
        settings = Settings(
            data_dir=Path(tmp) / "data",
            auth=AuthSettings(admin_key=SecretStr("bench-admin-key-0123456789")),
            log_level="WARNING",
        )
        embedder = SentenceTransformerEmbedder(device="cpu", query_format=query_format)
        services = build_services(
            settings, embedder=embedder, in_process_worker=False, announce_admin_key=False
        )
        t = time.perf_counter()
        key, cid, corpus = load_collection(services, real, n_chunks)
        print(f"  collection of {n_chunks} chunks written in {time.perf_counter() - t:.1f} s")

        # A few of the set's queries are binary garbage holding NUL characters, which the API
        # refuses (422, as any JSON text with NUL): they are sent without them.
        texts = [t.replace("\x00", "") for t in real.query_texts[:n_queries]]
        qvec = embedder.embed(texts)
        agree = float(np.mean(np.sum(qvec * real.queries[:n_queries], axis=1)))
        print(f"  query vectors vs queries.f32.npy: mean cosine {agree:.4f}")
        gt_rows = exact_topk(corpus.vectors, qvec, K)
        gt_ids = corpus.chunk_ids[gt_rows]

        headers = {"Authorization": f"Bearer {key}"}
        # Write the first generation now: the server loads it instead of building from SQL.
        services.indexes.get(cid)
        services.indexes.snapshot(cid)
        with (
            Server(settings.data_dir, "bench-admin-key-0123456789") as server,
            httpx.Client(timeout=600) as client,
        ):
            url = f"{server.url}/v1/collections/{cid}/search"
            t = time.perf_counter()
            first = client.post(url, json={"query": texts[0], "k": K}, headers=headers)
            first.raise_for_status()
            print(f"  index opened (built from SQL) in {time.perf_counter() - t:.1f} s")
            for text in texts[:10]:
                client.post(url, json={"query": text, "k": K}, headers=headers)

            def ask(i: int) -> dict[str, Any]:
                r = client.post(url, json={"query": texts[i], "k": K}, headers=headers)
                r.raise_for_status()
                return r.json()  # type: ignore[no-any-return]

            times, bodies = time_each(ask, n_queries)
            found = [[corpus.by_uid[p["chunk_id"]] for p in b["passages"]] for b in bodies]
            kind = bodies[0]["index"]["kind"]
            knobs = bodies[0]["knobs"]
            results.append(
                latency(
                    "ragserve POST /search (HTTP, embed included)",
                    times,
                    recall_at_k(found, gt_ids, K),
                    f"{kind}, ef_search={knobs.get('ef_search')}",
                )
            )
            for stage in ("embed", "search", "hydrate", "total"):
                extra[stage] = percentile([b["timings_ms"].get(stage, 0.0) for b in bodies], 50)

            embed_times, _ = time_each(lambda i: embedder.embed([texts[i]]), n_queries)
            results.append(
                latency(
                    "query embedding alone (in process, same embedder)",
                    embed_times,
                    float("nan"),
                    "the floor under every row that embeds; measured right after the HTTP run",
                )
            )

        # In process, like for like with chromadb's embedded client: our index alone on the
        # precomputed vector, and the whole search path (embed, index, hydrate texts from SQL,
        # tenant and tombstone checks). chromadb's two queries run interleaved with ours, query
        # by query in rotating order, so both sides see the same machine: on this shared box
        # the same embedder's p99 moved by 40% between minutes.
        from rag.retrieve import Retriever

        sp = Knobs(k=K)
        tenant_id = _tenant_of(services, cid)
        # The same search path with the query vector looked up instead of computed: the
        # embedder is one object shared by both sides, so this pair compares what each
        # system does with a vector (search, fetch the texts), without the embedder's noise.
        vectors = {text: qvec[i : i + 1] for i, text in enumerate(texts)}
        known = Retriever(
            services.db, Precomputed(embedder, vectors), services.indexes, settings.search
        )
        ours_index = {
            "ragserve index only (in process, precomputed vector)": lambda i: [
                int(x) for x in services.indexes.search(cid, qvec[i : i + 1], sp).hits[0].ids
            ]
        }
        ours_known = {
            "ragserve search path (in process, precomputed vector, with texts)": lambda i: [
                p.chunk_id for p in known.search(tenant_id, cid, texts[i], Knobs(k=K)).passages
            ]
        }
        ours_path = {
            "ragserve search path (in process, embed included, with texts)": lambda i: [
                p.chunk_id
                for p in services.retriever.search(tenant_id, cid, texts[i], Knobs(k=K)).passages
            ]
        }
        with chroma_collection(corpus) if with_chroma else _no_chroma() as col:
            for ours, mode in (
                (ours_index, "ids"),
                (ours_known, "documents"),
                (ours_path, "embed"),
            ):
                theirs = chroma_query(col, qvec, mode, embedder, texts)
                results += compare(ours, theirs, n_queries, gt_ids, kind)
        services.close()
    return results, extra


def time_interleaved(
    fns: dict[str, Callable[[int], Any]], n: int
) -> dict[str, tuple[list[float], list[Any]]]:
    """Call every fn(i) for i in range(n), one call at a time, the order rotated per query;
    per-call milliseconds and results of each."""
    names = list(fns)
    out: dict[str, tuple[list[float], list[Any]]] = {name: ([], []) for name in names}
    for i in range(n):
        shift = i % len(names)
        for name in names[shift:] + names[:shift]:
            t = time.perf_counter()
            result = fns[name](i)
            out[name][0].append((time.perf_counter() - t) * 1000.0)
            out[name][1].append(result)
    return out


def compare(
    ours: dict[str, Callable[[int], list[int]]],
    theirs: dict[str, Callable[[int], list[int]]],
    n: int,
    gt_ids: I64,
    kind: str,
) -> list[Latency]:
    fns = {**ours, **theirs}
    for fn in fns.values():  # warm both
        for i in range(10):
            fn(i)
    timed = time_interleaved(fns, n)
    notes = {name: kind for name in ours} | {name: _chroma_note(name) for name in theirs}
    return [
        latency(name, times, recall_at_k(found, gt_ids, K), notes[name])
        for name, (times, found) in timed.items()
    ]


def _chroma_note(name: str) -> str:
    import chromadb

    note = f"chromadb {chromadb.__version__}"
    if "embed included" in name:
        note += "; the same MiniLM embedder object as ragserve"
    return note


@contextmanager
def _no_chroma() -> Iterator[None]:
    yield None


@contextmanager
def chroma_collection(corpus: Corpus) -> Iterator[Any]:
    """chromadb's embedded client in a temp dir, default collection settings (default HNSW
    parameters, l2 space, which on unit vectors ranks exactly as inner product), the same
    chunk ids, vectors and texts."""
    import chromadb

    with tempfile.TemporaryDirectory(prefix="chroma-bench-") as tmp:
        client = chromadb.PersistentClient(
            path=tmp, settings=chromadb.Settings(anonymized_telemetry=False)
        )
        col = client.create_collection("bench", embedding_function=None)
        batch = min(client.get_max_batch_size(), 5000)
        t = time.perf_counter()
        for start in range(0, len(corpus.texts), batch):
            stop = start + batch
            col.add(
                ids=[str(c) for c in corpus.chunk_ids[start:stop].tolist()],
                embeddings=corpus.vectors[start:stop],
                documents=corpus.texts[start:stop],
            )
        print(
            f"  chromadb {chromadb.__version__}: {col.count()} added in "
            f"{time.perf_counter() - t:.1f} s"
        )
        # chromadb may still be persisting or compacting after the adds: let it settle.
        time.sleep(2.0)
        yield col


class Precomputed:
    """An embedder that looks the query's vector up (computed beforehand by `real`)."""

    def __init__(self, real: Any, vectors: dict[str, F32]) -> None:
        self.model_id, self.dim, self.max_tokens = real.model_id, real.dim, real.max_tokens
        self._vectors = vectors

    def embed(self, texts: list[str], deadline: object = None) -> F32:
        return np.vstack([self._vectors[t] for t in texts])


def chroma_query(
    col: Any, qvec: F32, mode: str, embedder: Any, texts: list[str]
) -> dict[str, Callable[[int], list[int]]]:
    """chromadb's query as a user would call it: on the precomputed vector for ids only
    (`ids`) or with the documents (`documents`), or embedding the text first and returning the
    documents (`embed`; chromadb's own default embedding function downloads an ONNX model,
    which this machine cannot, so it is given ragserve's embedder object)."""
    if col is None:
        return {}

    def ids_of(r: Any) -> list[int]:
        return [int(x) for x in r["ids"][0]]

    if mode == "ids":
        return {
            "chromadb query (in process, precomputed vector, ids only)": lambda i: ids_of(
                col.query(query_embeddings=qvec[i : i + 1], n_results=K, include=["distances"])
            )
        }
    if mode == "documents":
        return {
            "chromadb query (in process, precomputed vector, with documents)": lambda i: ids_of(
                col.query(
                    query_embeddings=qvec[i : i + 1],
                    n_results=K,
                    include=["documents", "distances"],
                )
            )
        }
    return {
        "chromadb query (in process, embed included, with documents)": lambda i: ids_of(
            col.query(
                query_embeddings=embedder.embed([texts[i]]),
                n_results=K,
                include=["documents", "distances"],
            )
        )
    }


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
        help="what embeds the HTTP run's queries (RAG_EMBED__QUERY_FORMAT; auto is int8)",
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
