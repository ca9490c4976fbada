"""Retrieval quality on docfaq (../shared/data/docfaq): dense, BM25 and hybrid.

    python bench/quality.py [--quick] [--queries N] [--weights 0.1,0.2,0.3,0.5]

The corpus (23,201 passages of the Python documentation) goes into a real SQLite collection,
one document and one chunk per passage (chunk text: title, blank line, passage text), with
the precomputed all-MiniLM-L6-v2 vectors (emb_minilm.npy), so nothing but the queries is
embedded. The FAQ questions are the queries (queries.jsonl, qrels.tsv: the passages that hold
the answer). Then, through the service's own code:

- dense: `Retriever.search` with exact search (the index's exact scan of the same vectors);
- BM25: `rag.fulltext.keyword_search`, SQLite FTS5's bm25(), the keyword side of hybrid search;
- hybrid: `Retriever.search` with exact dense and `hybrid` = each keyword weight (weighted
  reciprocal-rank fusion, rag.retrieve.fuse).

Metrics per query, averaged: recall@10, MRR@10, nDCG@10 (rag.eval's functions). `--quick`
uses a subset of the queries (the corpus is always complete). Ends with FIGURE ndcg10_dense,
FIGURE ndcg10_bm25, FIGURE ndcg10_hybrid (the best weight, named in the table).
"""

from __future__ import annotations

import argparse
import hashlib
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

from rag.knobs import Knobs  # noqa: E402
from rag.ops import eval as evaluation  # noqa: E402

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

    def embed(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
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
    passage, with change-log rows so the index builds from SQL as usual. Returns
    (API key, tenant id, collection id)."""
    from sqlalchemy import insert, select

    from rag.auth import create_key
    from rag.db import collections
    from rag.db.models import Blob, ChangeLog, Chunk, Document, new_id, now

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
        stop = min(start + batch, len(ids))
        t = now()
        blobs, docs, chunks, doc_ids = [], [], [], []
        for i in range(start, stop):
            # The corpus id in the bytes: two passages with the same text stay two documents.
            data = f"{ids[i]}\n\n{texts[i]}".encode()
            sha = hashlib.sha256(data).hexdigest()
            doc_id = new_id()
            doc_ids.append(doc_id)
            blobs.append(
                {
                    "tenant_id": tenant_id,
                    "sha256": sha,
                    "size": len(data),
                    "data": data,
                    "created_at": t,
                }
            )
            docs.append(
                {
                    "id": doc_id,
                    "tenant_id": tenant_id,
                    "collection_id": cid,
                    "filename": f"{ids[i]}.txt",
                    "media_type": "text/plain",
                    "sha256": sha,
                    "size": len(data),
                    "status": "indexed",
                    "meta": {"_id": ids[i]},
                    "text": texts[i],
                    "chunk_count": 1,
                    "created_at": t,
                    "updated_at": t,
                    "indexed_at": t,
                }
            )
            chunks.append(
                {
                    "uid": f"{doc_id}:0",
                    "document_id": doc_id,
                    "collection_id": cid,
                    "tenant_id": tenant_id,
                    "ordinal": 0,
                    "text": texts[i],
                    "start_char": 0,
                    "end_char": len(texts[i]),
                    "token_count": len(texts[i].split()),
                    "embedding": vectors[i].astype("<f4").tobytes(),
                    "embedding_model": embedder.model_id,
                }
            )
        with services.db.write() as session:
            session.execute(insert(Blob), blobs)
            session.execute(insert(Document), docs)
            session.execute(insert(Chunk), chunks)
            rows = session.execute(
                select(Chunk.id, Chunk.document_id).where(Chunk.document_id.in_(doc_ids))
            ).all()
            session.execute(
                insert(ChangeLog),
                [
                    {"collection_id": cid, "op": "add", "chunk_id": c, "document_id": d}
                    for c, d in rows
                ],
            )
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
    parser.add_argument("--weights", default="0.1,0.2,0.3,0.5", help="hybrid keyword weights")
    parser.add_argument("--data", default=str(DOCFAQ), help="the docfaq folder")
    parser.add_argument("--limit-corpus", type=int, help="smoke runs only: fewer passages")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    root = Path(args.data)
    weights = [float(w) for w in args.weights.split(",") if w.strip()]

    from rag.config import Settings
    from rag.db.fulltext import keyword_search
    from rag.embed import SentenceTransformerEmbedder
    from rag.services import build_services

    queries = evaluation.read_queries(root / "queries.jsonl")
    qrels = evaluation.read_qrels(root / "qrels.tsv")
    qids = [q for q in queries if q in qrels]
    n = args.queries or (80 if args.quick else len(qids))
    # An even spread over the file (the FAQ sections come in order), the same every run.
    qids = [qids[i] for i in np.linspace(0, len(qids) - 1, min(n, len(qids))).astype(int)]

    t = time.perf_counter()
    ids, texts, vectors = load_passages(root)
    if args.limit_corpus:
        ids, texts, vectors = (
            ids[: args.limit_corpus],
            texts[: args.limit_corpus],
            vectors[: args.limit_corpus],
        )
    embedder = CachedEmbedder(SentenceTransformerEmbedder(device="cpu"))
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

            def scores(ranking: list[str], relevant: dict[str, int]) -> tuple[float, float, float]:
                return (
                    evaluation.recall_at(ranking, relevant, 10),
                    evaluation.mrr_at(ranking, relevant, 10),
                    evaluation.ndcg_at(ranking, relevant, 10),
                )

            def retriever(knobs: Knobs):  # type: ignore[no-untyped-def]
                def run(query: str, relevant: dict[str, int]) -> list[str]:
                    result = services.retriever.search(tenant_id, cid, query, knobs)
                    return evaluation._ranking(
                        (p.document_id for p in result.passages), names, relevant
                    )

                return run

            def bm25(query: str, relevant: dict[str, int]) -> list[str]:
                with services.db.read() as session:
                    hits = keyword_search(session, cid, query, 10)
                missing = [c for c, _ in hits if c not in chunk_to_doc]
                if missing:
                    from sqlalchemy import select

                    from rag.db.models import Chunk

                    with services.db.read() as session:
                        for c, d in session.execute(
                            select(Chunk.id, Chunk.document_id).where(Chunk.id.in_(missing))
                        ):
                            chunk_to_doc[c] = d
                return evaluation._ranking((chunk_to_doc[c] for c, _ in hits), names, relevant)

            runs: dict[str, Any] = {"dense (exact)": retriever(Knobs(k=10, exact=True))}
            runs["BM25 (FTS5)"] = bm25
            for w in weights:
                runs[f"hybrid w={w}"] = retriever(Knobs(k=10, exact=True, hybrid=w))
            totals = {name: np.zeros(3) for name in runs}
            took = {name: 0.0 for name in runs}
            t = time.perf_counter()
            embedder.embed([queries[q] for q in qids])  # one batch; the runs then hit the cache
            print(f"  {len(qids)} queries embedded in {time.perf_counter() - t:.1f} s", flush=True)
            for qid in qids:
                for name, run in runs.items():
                    t = time.perf_counter()
                    ranking = run(queries[qid], qrels[qid])
                    took[name] += time.perf_counter() - t
                    totals[name] += scores(ranking, qrels[qid])
        finally:
            services.close()

    means = {name: totals[name] / len(qids) for name in runs}
    best = max((n for n in runs if n.startswith("hybrid")), key=lambda n: means[n][2], default=None)
    rows = []
    for name in runs:
        r, m, nd = means[name]
        label = f"{name} (best)" if name == best else name
        rows.append((label, float(r), float(m), float(nd), 1000.0 * took[name] / len(qids)))
    print(
        f"\n## Retrieval quality on docfaq ({len(ids)} passages, {len(qids)} queries"
        f"{', quick subset' if len(qids) < len(queries) else ''})\n"
    )
    print(md_table(["method", "recall@10", "MRR@10", "nDCG@10", "ms/query"], rows))
    print(
        f"\nall-MiniLM-L6-v2 vectors (precomputed), exact dense search; BM25 is SQLite FTS5;"
        f" hybrid is weighted reciprocal-rank fusion. {platform.platform()}\n"
    )
    print(f"FIGURE ndcg10_dense {means['dense (exact)'][2]:.4f}")
    print(f"FIGURE ndcg10_bm25 {means['BM25 (FTS5)'][2]:.4f}")
    if best is not None:
        print(f"FIGURE ndcg10_hybrid {means[best][2]:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
