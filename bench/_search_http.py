"""`bench/search.py`'s figures 3 and 4: `POST /search` over HTTP against a real SQLite
collection, and chromadb on the same corpus, timed interleaved with ragserve in process.

The collection (`load_collection`): tenant, key and collection through the service layer, then
documents of 500 chunks written as the worker writes them, with precomputed vectors: the
24,576 real MiniLM passages first, then perturbed copies carrying their source passage's text
(`_data.synthesize`). `rag serve` serves it in its own process (`Server`); the first search
opens the index, and a snapshot is written before timing. bench/scale.py uses both.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from bench._data import (
    F32,
    I64,
    RealSet,
    exact_topk,
    percentile,
    recall_at_k,
    synthesize,
    time_each,
)
from rag.deadline import Deadline
from rag.index import Knobs

log = logging.getLogger("bench.search")

K = 10  # results a search returns, and recall@K


@dataclass
class Corpus:
    vectors: F32
    texts: list[str]
    chunk_ids: I64  # row -> chunk id in SQL
    # The API's opaque chunk ids (the chunk's uid) -> the SQL ids the ground truth uses.
    by_uid: dict[str, int] = field(default_factory=dict)


def load_collection(services: Any, real: RealSet, n: int) -> tuple[str, str, Corpus]:
    """A real SQLite collection of `n` chunks: tenant, key and collection through the service
    layer; documents written as the worker writes them, with precomputed vectors (the real
    passages first, then perturbed copies carrying their source passage's text)."""
    from rag.auth import create_key
    from rag.db import collections, seed

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
        body, chunks = seed.joined(texts[start:stop])
        doc = seed.SeedDocument(
            filename=f"bench-{d:05d}.txt",
            data=f"bench document {d}\n".encode() + body.encode(),
            text=body,
            chunks=chunks,
            vectors=vectors[start:stop],
        )
        [written] = seed.documents(services.db, cid, [doc], embedder.model_id)
        chunk_ids[start:stop] = written.chunk_ids
        by_uid.update(zip(written.chunk_uids, written.chunk_ids, strict=True))
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
        # by query in rotating order, so both sides see the same machine: on a shared box the
        # same embedder's p99 moves from one minute to the next.
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
        self.semantic: bool = real.semantic
        self._real = real
        self._vectors = vectors

    def embed(self, texts: Sequence[str], deadline: Deadline | None = None) -> F32:
        return np.vstack([self._vectors[t] for t in texts])

    def token_spans(self, text: str) -> list[tuple[int, int]]:
        return self._real.token_spans(text)  # type: ignore[no-any-return]


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
