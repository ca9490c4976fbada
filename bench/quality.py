"""Retrieval quality on docfaq (../shared/data/docfaq): dense, BM25, hybrid, query formats.

    python bench/quality.py [--quick] [--queries N] [--weights 0.05,0.1,0.15,0.2,0.3]
                            [--formats float32,int8] [--skip-formats]

The corpus (23,201 passages of the Python documentation) goes into a real SQLite collection,
one document and one chunk per passage (chunk text: title, blank line, passage text), with
the precomputed all-MiniLM-L6-v2 vectors (emb_minilm.npy), so nothing but the queries is
embedded. The FAQ questions are the queries (queries.jsonl, qrels.tsv: the passages that hold
the answer). Then, through the service's own code, with float32 query vectors:

- dense: `Retriever.search` with exact search (the index's exact scan of the same vectors);
- BM25: `rag.fulltext.keyword_search`, SQLite FTS5's bm25(), the keyword side of hybrid search;
- hybrid: `Retriever.search` with exact dense and `hybrid` = each keyword weight (z-score
  fusion, rag.retrieve.fuse); and, for comparison, weighted reciprocal-rank fusion (what
  fuse did before) of the same two lists (dense top 15, keyword top 30).

Metrics per query, averaged: recall@10, MRR@10, nDCG@10 (rag.eval's functions), also over the
even- and odd-numbered queries apart: a weight is chosen on the even half (the shipped one,
rag.retrieve.SUGGESTED_HYBRID, was) and must hold on the odd half.

Query formats (rag.embed.onnx: ONNX Runtime float32 and int8): every query embedded one at a
time by each format, the formats interleaved query by query (the order rotated), at 1 and 2
threads: p50/p99 of the embedding alone; and each format's nDCG@10 / recall@10 by exact
search over the same float32 document vectors, against float32 queries paired per query
(bootstrap 95% interval of the mean difference, 10,000 resamples). Ingest is not measured
here: documents are embedded by torch in float32 whatever the query format.

`--quick` uses a subset of the queries (the corpus is always complete). Ends with FIGURE
ndcg10_dense, FIGURE ndcg10_bm25, FIGURE ndcg10_hybrid (at SUGGESTED_HYBRID), FIGURE
embed_ndcg_ratio (the shipped query format's nDCG@10 over float32's), FIGURE
embed_query_p99_ms (the shipped format, 2 threads) and FIGURE embed_query_p99_ms_float32.
"""

from __future__ import annotations

import argparse
import json
import logging
import platform
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rag.embed.onnx import AUTO_FORMAT  # noqa: E402
from rag.knobs import Knobs  # noqa: E402
from rag.ops import eval as evaluation  # noqa: E402
from rag.retrieve import SUGGESTED_HYBRID  # noqa: E402

DOCFAQ = Path(__file__).resolve().parents[2] / "shared" / "data" / "docfaq"
log = logging.getLogger("bench.quality")


class CachedEmbedder:
    """The real embedder, remembering query vectors: each query is embedded once for all
    the settings compared."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.dim = inner.dim
        self.model_id = inner.model_id
        self.max_tokens = getattr(inner, "max_tokens", 254)
        self._cache: dict[str, npt.NDArray[np.float32]] = {}

    def embed(self, texts: Sequence[str], deadline: object = None) -> npt.NDArray[np.float32]:
        missing = [t for t in texts if t not in self._cache]
        if missing:
            for text, vec in zip(missing, self.inner.embed(missing), strict=True):
                self._cache[text] = vec
        return np.stack([self._cache[t] for t in texts])

    def token_spans(self, text: str) -> list[tuple[int, int]]:
        return self.inner.token_spans(text)  # type: ignore[no-any-return]


def load_passages(root: Path = DOCFAQ) -> tuple[list[str], list[str], npt.NDArray[np.float32]]:
    """(corpus ids, chunk texts, vectors [n, 384]) in the vectors' order."""
    ids = (root / "emb_minilm.ids.txt").read_text().split()
    vectors = np.ascontiguousarray(np.load(root / "emb_minilm.npy"), dtype=np.float32)
    by_id: dict[str, str] = {}
    with (root / "corpus.jsonl").open() as f:
        for line in f:
            row = json.loads(line)
            title = row.get("title") or ""
            by_id[row["_id"]] = f"{title}\n\n{row['text']}" if title else row["text"]
    if len(ids) != len(vectors):
        raise SystemExit(f"{len(ids)} ids but {len(vectors)} vectors")
    return ids, [by_id[i] for i in ids], vectors


def insert_passages(
    services: Any,
    tenant_name: str,
    ids: list[str],
    texts: list[str],
    vectors: npt.NDArray[np.float32],
    *,
    batch: int = 1000,
) -> tuple[str, str, str]:
    """A collection holding one document (metadata `_id` = corpus id) and one chunk per
    passage, written as the worker writes them, so the index builds from SQL as usual.
    Returns (API key, tenant id, collection id)."""
    from rag.auth import create_key
    from rag.db import collections, seed

    embedder = services.embedder
    key, tenant_id = create_key(services.db, tenant_name)
    with services.db.write() as session:
        cid = collections.create(
            session,
            tenant_id,
            name="docfaq",
            description="docfaq passages",
            embedding_model=embedder.model_id,
            embedding_dim=embedder.dim,
            chunk_tokens=256,
            chunk_overlap=0,
            index_kind="auto",
            index_params={},
            search_defaults={},
        ).id
    for start in range(0, len(ids), batch):
        docs = [
            seed.SeedDocument(
                filename=f"{ids[i]}.txt",
                # The corpus id in the bytes: two passages with the same text stay two documents.
                data=f"{ids[i]}\n\n{texts[i]}".encode(),
                text=texts[i],
                chunks=[seed.one_chunk(texts[i])],
                vectors=vectors[i : i + 1],
                meta={"_id": ids[i]},
            )
            for i in range(start, min(start + batch, len(ids)))
        ]
        seed.documents(services.db, cid, docs, embedder.model_id)
    return key, tenant_id, cid


def md_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    def cell(v: Any) -> str:
        return f"{v:.3f}" if isinstance(v, float) else str(v)

    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="a subset of the queries (80)")
    parser.add_argument("--queries", type=int, help="how many queries (default: all)")
    parser.add_argument("--weights", default="0.05,0.1,0.15,0.2,0.3", help="hybrid keyword weights")
    parser.add_argument("--formats", default="float32,int8", help="query formats to compare")
    parser.add_argument("--skip-formats", action="store_true", help="no query-format section")
    parser.add_argument("--data", default=str(DOCFAQ), help="the docfaq folder")
    parser.add_argument("--limit-corpus", type=int, help="smoke runs only: fewer passages")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    root = Path(args.data)
    weights = [float(w) for w in args.weights.split(",") if w.strip()]
    if SUGGESTED_HYBRID not in weights:
        weights = sorted({*weights, SUGGESTED_HYBRID})

    from rag.config import Settings
    from rag.db.fulltext import keyword_search
    from rag.embed import SentenceTransformerEmbedder
    from rag.services import build_services

    queries = evaluation.read_queries(root / "queries.jsonl")
    qrels = evaluation.read_qrels(root / "qrels.tsv")
    judged = [q for q in queries if q in qrels]
    n = args.queries or (80 if args.quick else len(judged))
    # An even spread over the file (the FAQ sections come in order), the same every run.
    picked = np.linspace(0, len(judged) - 1, min(n, len(judged))).astype(int)
    qids = [judged[i] for i in picked]
    # Halves by position in the whole file, so that a subset keeps each query's half.
    even = np.array([i % 2 == 0 for i in picked])

    ids, texts, vectors = load_passages(root)
    if args.limit_corpus:
        ids, texts, vectors = (
            ids[: args.limit_corpus],
            texts[: args.limit_corpus],
            vectors[: args.limit_corpus],
        )
    # float32 queries for the retrieval table: fusion is compared on the exact computation;
    # the query formats have their own section below.
    embedder = CachedEmbedder(SentenceTransformerEmbedder(device="cpu", query_format="float32"))
    # The stored vectors must be this model's: compare a few with fresh embeddings.
    agree = float(np.mean(np.sum(embedder.inner.embed(texts[:16]) * vectors[:16], axis=1)))
    print(f"  stored vectors vs the bundled model on 16 passages: mean cosine {agree:.4f}")

    with tempfile.TemporaryDirectory(prefix="rag-quality-") as tmp:
        settings = Settings(
            data_dir=Path(tmp),
            ingest={"in_process_worker": False},
            auth={"admin_key": "bench-admin-key-0123456789"},
        )
        services = build_services(settings, embedder=embedder, announce_admin_key=False)
        try:
            t = time.perf_counter()
            _, tenant_id, cid = insert_passages(services, "quality", ids, texts, vectors)
            print(f"  {len(ids)} passages written in {time.perf_counter() - t:.1f} s", flush=True)
            t = time.perf_counter()
            services.indexes.catch_up(cid)
            state = services.indexes.state(cid)
            print(f"  index {state.kind} of {state.count} built in {time.perf_counter() - t:.1f} s")
            names = evaluation.corpus_ids(services, cid)
            chunk_to_doc: dict[int, str] = {}

            def retriever(knobs: Knobs):  # type: ignore[no-untyped-def]
                def run(query: str, relevant: dict[str, int]) -> list[str]:
                    result = services.retriever.search(tenant_id, cid, query, knobs)
                    return evaluation._ranking(
                        (p.document_id for p in result.passages), names, relevant
                    )

                return run

            def keyword_docs(query: str, limit: int) -> list[str]:
                with services.db.read() as session:
                    hits = keyword_search(session, cid, query, limit)
                missing = [c for c, _ in hits if c not in chunk_to_doc]
                if missing:
                    from sqlalchemy import select

                    from rag.db.models import Chunk

                    with services.db.read() as session:
                        for c, d in session.execute(
                            select(Chunk.id, Chunk.document_id).where(Chunk.id.in_(missing))
                        ):
                            chunk_to_doc[c] = d
                return [chunk_to_doc[c] for c, _ in hits]

            def bm25(query: str, relevant: dict[str, int]) -> list[str]:
                return evaluation._ranking(keyword_docs(query, 10), names, relevant)

            def rrf(weight: float):  # type: ignore[no-untyped-def]
                """Weighted reciprocal-rank fusion (k = 60) of the lists hybrid search fuses."""

                def run(query: str, relevant: dict[str, int]) -> list[str]:
                    dense = services.retriever.search(
                        tenant_id, cid, query, Knobs(k=15, exact=True)
                    ).passages
                    fused: dict[str, float] = {}
                    for rank, p in enumerate(dense):
                        fused[p.document_id] = (1 - weight) / (61 + rank)
                    for rank, doc in enumerate(keyword_docs(query, 30)):
                        fused[doc] = fused.get(doc, 0.0) + weight / (61 + rank)
                    order = sorted(fused, key=lambda d: -fused[d])[:10]
                    return evaluation._ranking(order, names, relevant)

                return run

            runs: dict[str, Any] = {"dense (exact)": retriever(Knobs(k=10, exact=True))}
            runs["BM25 (FTS5)"] = bm25
            runs["RRF w=0.1 (before)"] = rrf(0.1)
            runs["RRF w=0.3 (before)"] = rrf(0.3)
            for w in weights:
                runs[f"hybrid w={w}"] = retriever(Knobs(k=10, exact=True, hybrid=w))
            per = {name: np.zeros((len(qids), 3)) for name in runs}
            took = {name: 0.0 for name in runs}
            t = time.perf_counter()
            embedder.embed([queries[q] for q in qids])  # one batch; the runs then hit the cache
            print(f"  {len(qids)} queries embedded in {time.perf_counter() - t:.1f} s", flush=True)
            for row, qid in enumerate(qids):
                for name, run in runs.items():
                    t = time.perf_counter()
                    ranking = run(queries[qid], qrels[qid])
                    took[name] += time.perf_counter() - t
                    per[name][row] = scores(ranking, qrels[qid])
        finally:
            services.close()

    hybrids = [name for name in runs if name.startswith("hybrid")]
    chosen = max(hybrids, key=lambda name: per[name][even, 2].mean(), default=None)
    shipped = f"hybrid w={SUGGESTED_HYBRID}"
    rows = []
    for name in runs:
        r, m, nd = per[name].mean(axis=0)
        label = name
        if name == shipped:
            label += " (shipped)"
        if name == chosen:
            label += " (best on even)"
        rows.append(
            (
                label,
                float(r),
                float(m),
                float(nd),
                float(per[name][even, 2].mean()) if even.any() else float("nan"),
                float(per[name][~even, 2].mean()) if (~even).any() else float("nan"),
                1000.0 * took[name] / len(qids),
            )
        )
    print(
        f"\n## Retrieval quality on docfaq ({len(ids)} passages, {len(qids)} queries"
        f"{', quick subset' if len(qids) < len(judged) else ''})\n"
    )
    print(
        md_table(
            [
                "method",
                "recall@10",
                "MRR@10",
                "nDCG@10",
                f"nDCG@10 even ({int(even.sum())})",
                f"nDCG@10 odd ({int((~even).sum())})",
                "ms/query",
            ],
            rows,
        )
    )
    base = per["dense (exact)"][:, 2]
    lo, hi = paired_ci(per[shipped][:, 2] - base)
    print(
        f"\nall-MiniLM-L6-v2 vectors (precomputed), float32 queries, exact dense search; BM25 is"
        f" SQLite FTS5; hybrid is the z-score fusion of rag.retrieve.fuse. Shipped weight"
        f" {SUGGESTED_HYBRID} minus dense, nDCG@10 per query: mean"
        f" {float(np.mean(per[shipped][:, 2] - base)):+.4f}, 95% CI [{lo:+.4f}, {hi:+.4f}]."
        f" {platform.platform()}\n"
    )

    figures = [
        f"FIGURE ndcg10_dense {base.mean():.4f}",
        f"FIGURE ndcg10_bm25 {per['BM25 (FTS5)'][:, 2].mean():.4f}",
        f"FIGURE ndcg10_hybrid {per[shipped][:, 2].mean():.4f}",
    ]
    if not args.skip_formats:
        formats = [f.strip() for f in args.formats.split(",") if f.strip()]
        figures += query_formats(
            embedder.inner,
            [queries[q] for q in qids],
            [qrels[q] for q in qids],
            ids,
            vectors,
            formats,
        )
    print("\n".join(figures))
    return 0


def scores(ranking: list[str], relevant: dict[str, int]) -> tuple[float, float, float]:
    return (
        evaluation.recall_at(ranking, relevant, 10),
        evaluation.mrr_at(ranking, relevant, 10),
        evaluation.ndcg_at(ranking, relevant, 10),
    )


def paired_ci(diff: npt.NDArray[np.float64], n: int = 10_000, seed: int = 0) -> tuple[float, float]:
    """The bootstrap 95% interval of the mean of per-query differences."""
    rng = np.random.default_rng(seed)
    means = diff[rng.integers(0, len(diff), (n, len(diff)))].mean(axis=1)
    lo, hi = np.percentile(means, [2.5, 97.5])
    return float(lo), float(hi)


def query_formats(
    st_embedder: Any,
    texts: list[str],
    relevant: list[dict[str, int]],
    ids: list[str],
    doc_vectors: npt.NDArray[np.float32],
    formats: list[str],
) -> list[str]:
    """Each query format's speed (one query at a time, 1 and 2 threads) and quality (exact
    search over the float32 document vectors, paired against float32 queries). Returns its
    FIGURE lines."""
    if "float32" not in formats:
        formats = ["float32", *formats]
    vectors: dict[str, npt.NDArray[np.float32]] = {}
    latency: dict[tuple[str, int], list[float]] = {}
    built: dict[str, str] = {}
    for threads in (1, 2):
        encoders = {}
        for fmt in formats:
            t = time.perf_counter()
            encoder = st_embedder.query_encoder(fmt, threads)
            if encoder is None:
                raise SystemExit("the model has no ONNX path: nothing to compare")
            built[fmt] = f"{encoder.format}, built in {time.perf_counter() - t:.1f} s"
            encoders[fmt] = encoder
        for encoder in encoders.values():
            for text in texts[:10]:
                encoder([text])
        out = {fmt: np.zeros((len(texts), st_embedder.dim), np.float32) for fmt in formats}
        for fmt in formats:
            latency[(fmt, threads)] = []
        for i, text in enumerate(texts):
            # The formats take turns query by query, in a rotating order: on a shared machine
            # they then see the same load.
            for j in range(len(formats)):
                fmt = formats[(i + j) % len(formats)]
                t = time.perf_counter()
                out[fmt][i] = encoders[fmt]([text])[0]
                latency[(fmt, threads)].append(1000.0 * (time.perf_counter() - t))
        vectors.update(out)
        del encoders

    def quality(q: npt.NDArray[np.float32]) -> npt.NDArray[np.float64]:
        sims = q @ doc_vectors.T
        top = np.argsort(-sims, axis=1)[:, :10]
        return np.array(
            [
                (
                    evaluation.ndcg_at([ids[j] for j in row], rel, 10),
                    evaluation.recall_at([ids[j] for j in row], rel, 10),
                )
                for row, rel in zip(top, relevant, strict=True)
            ]
        )

    per = {fmt: quality(v) for fmt, v in vectors.items()}
    base = per["float32"]
    rows = []
    for fmt in formats:
        cos = np.sum(vectors[fmt] * vectors["float32"], axis=1)
        nd_lo, nd_hi = paired_ci(per[fmt][:, 0] - base[:, 0])
        rc_lo, rc_hi = paired_ci(per[fmt][:, 1] - base[:, 1])
        for threads in (1, 2):
            lat = latency[(fmt, threads)]
            rows.append(
                (
                    fmt,
                    threads,
                    float(np.percentile(lat, 50)),
                    float(np.percentile(lat, 99)),
                    float(per[fmt][:, 0].mean()),
                    f"{per[fmt][:, 0].mean() - base[:, 0].mean():+.4f}"
                    f" [{nd_lo:+.4f}, {nd_hi:+.4f}]",
                    float(per[fmt][:, 1].mean()),
                    f"{per[fmt][:, 1].mean() - base[:, 1].mean():+.4f}"
                    f" [{rc_lo:+.4f}, {rc_hi:+.4f}]",
                    f"{cos.min():.4f} / {cos.mean():.4f}",
                )
            )
    print(f"\n## Query formats ({len(texts)} queries, one at a time)\n")
    print(
        md_table(
            [
                "format",
                "threads",
                "p50 ms",
                "p99 ms",
                "nDCG@10",
                "vs float32 [95% CI]",
                "recall@10",
                "vs float32 [95% CI]",
                "cosine to float32 min / mean",
            ],
            rows,
        )
    )
    print(
        "\nONNX Runtime, query embedding alone (tokenizer included), formats interleaved;"
        " quality by exact search over the same float32 document vectors. Built: "
        + "; ".join(f"{fmt}: {what}" for fmt, what in built.items())
        + f". {platform.platform()}\n"
    )
    shipped = AUTO_FORMAT if AUTO_FORMAT in formats else "float32"
    ratio = per[shipped][:, 0].mean() / base[:, 0].mean()
    return [
        f"FIGURE embed_ndcg_ratio {ratio:.4f}",
        f"FIGURE embed_query_p99_ms {np.percentile(latency[(shipped, 2)], 99):.2f}",
        f"FIGURE embed_query_p99_ms_float32 {np.percentile(latency[('float32', 2)], 99):.2f}",
    ]


if __name__ == "__main__":
    sys.exit(main())
