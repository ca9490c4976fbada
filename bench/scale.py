"""Scale-out benchmark: what each component costs per unit of load (issue 17's figures).

    python bench/scale.py [--quick] [--sizes 25000,100000] [--queries N] [--jobs N]
                          [--pg-url URL] [--skip-queue]

1. The same collection (the search bench's synthetic set, in SQLite) at each size, the same
   queries: `POST /v1/collections/{id}/search` over HTTP (`rag serve` in its own process,
   query embedding included) with the in-process hnsw default, then with the collection
   rebuilt into Milvus (kind milvus, HNSW inside Milvus, knobs mapped; `milvus-lite server`
   in its own process, spoken to over gRPC exactly as a cluster). Per size and kind: recall@10
   against exact search, p50/p99, the API process's RSS (and Milvus's, separately), the time
   to build the index from SQL, and one replica's catch-up rate from the change log.
2. The PostgreSQL ingest queue on an empty pipeline (parse and embed stubbed, the claim, the
   lease and the write real): jobs/s with 1 and 2 worker processes. On 2 cores, more
   processes measure CPU contention as much as the queue.

Milvus Lite is a Python re-implementation of the server (faiss HNSW/IVF per segment): its
latency and recall say little about Milvus Standalone or Distributed, whose search runs in
C++ (Knowhere) across query nodes; what this measures is the protocol's hop and that the
API process no longer grows with the collection.

Ends with, one per line: FIGURE milvus_recall_at_10, FIGURE milvus_p99_ms,
FIGURE api_rss_growth_mb_25k_to_100k, FIGURE queue_claims_per_s_2_workers.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._data import (  # noqa: E402
    RealSet,
    exact_topk,
    load_real,
    percentile,
    recall_at_k,
    synthesize,
    table,
    time_each,
)
from bench._search_http import Server, load_collection  # noqa: E402

log = logging.getLogger("bench.scale")
K = 10
ADMIN = "bench-admin-key-for-scale"
DEFAULT_PG = os.environ.get("RAG_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")


# ------------------------------------------------------------------ processes


def rss_mb(pid: int) -> float:
    """Resident memory of one process, from /proc (MB)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024.0
    return float("nan")


class MilvusLite:
    """`milvus-lite server` on a free loopback port, in a folder of its own."""

    def __init__(self, root: Path) -> None:
        exe = Path(sys.executable).with_name("milvus-lite")
        found = str(exe) if exe.exists() else shutil.which("milvus-lite")
        if found is None:
            raise SystemExit("milvus-lite is not installed: pip install -e '.[bench]'")
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = int(sock.getsockname()[1])
        self.uri = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(
            [found, "server", "--data-dir", str(root / "milvus"), "--host", "127.0.0.1"]
            + ["--port", str(self.port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return
            except OSError:
                time.sleep(0.1)
        raise RuntimeError("milvus-lite server did not start")

    def rss_mb(self) -> float:
        return rss_mb(self.proc.pid)

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)


# ------------------------------------------------------------------ search at two sizes


@dataclass
class Row:
    size: int
    kind: str
    recall: float
    p50: float
    p99: float
    api_rss: float
    milvus_rss: float
    build_s: float
    catch_up_per_s: float
    note: str


def append_chunks(services: Any, cid: str, vectors: Any, texts: list[str]) -> Any:
    """One more document of `len(vectors)` chunks, written as a finished ingest job writes it
    (its change-log rows included), for the catch-up rate; its chunks' SQL ids."""
    from rag.db import seed

    body, chunks = seed.joined(texts)
    doc = seed.SeedDocument(
        filename="catch-up.txt",
        data=f"catch-up {uuid.uuid4().hex}\n".encode() + body.encode(),
        text=body,
        chunks=chunks,
        vectors=np.asarray(vectors, dtype=np.float32),
    )
    [written] = seed.documents(services.db, cid, [doc], services.embedder.model_id)
    BY_UID.update(zip(written.chunk_uids, written.chunk_ids, strict=True))
    return np.array(written.chunk_ids, dtype=np.int64)


# The API's opaque chunk ids (the chunk's uid) -> the SQL ids the ground truth uses, for the
# chunks this process seeded.
BY_UID: dict[str, int] = {}


def http_pass(
    settings: Any, key: str, cid: str, texts: list[str], gt_ids: Any
) -> tuple[float, float, float, float, str]:
    """recall@10, p50, p99 of POST /search in a fresh `rag serve`, and its RSS after."""
    import httpx

    with Server(settings.data_dir, ADMIN) as server, httpx.Client(timeout=600) as client:
        url = f"{server.url}/v1/collections/{cid}/search"
        headers = {"Authorization": f"Bearer {key}"}
        for text in texts[:10]:  # open the index, warm the lanes
            client.post(url, json={"query": text, "k": K}, headers=headers).raise_for_status()

        def ask(i: int) -> dict[str, Any]:
            r = client.post(url, json={"query": texts[i], "k": K}, headers=headers)
            r.raise_for_status()
            return r.json()  # type: ignore[no-any-return]

        times, bodies = time_each(ask, len(texts))
        assert server.proc is not None
        rss = rss_mb(server.proc.pid)
    found = [[BY_UID[p["chunk_id"]] for p in b["passages"]] for b in bodies]
    knobs = bodies[0]["knobs"]
    note = f"ef_search={knobs.get('ef_search')}"
    return recall_at_k(found, gt_ids, K), percentile(times, 50), percentile(times, 99), rss, note


def one_size(
    real: RealSet, n: int, n_queries: int, milvus: MilvusLite, catch_up_n: int
) -> list[Row]:
    from pydantic import SecretStr

    from rag.config import AuthSettings, MilvusSettings, Settings
    from rag.db import collections
    from rag.embed import SentenceTransformerEmbedder
    from rag.services import build_services

    rows: list[Row] = []
    prefix = f"bench{n}"
    with tempfile.TemporaryDirectory(prefix="ragserve-scale-") as tmp:
        settings = Settings(
            data_dir=Path(tmp) / "data",
            auth=AuthSettings(admin_key=SecretStr(ADMIN)),
            milvus=MilvusSettings(uri=milvus.uri, collection_prefix=prefix),
            log_level="WARNING",
        )
        # The server processes read the same configuration from the environment.
        os.environ["RAG_MILVUS__URI"] = milvus.uri
        os.environ["RAG_MILVUS__COLLECTION_PREFIX"] = prefix
        embedder = SentenceTransformerEmbedder(device="cpu")
        services = build_services(
            settings, embedder=embedder, in_process_worker=False, announce_admin_key=False
        )
        t = time.perf_counter()
        key, cid, corpus = load_collection(services, real, n)
        BY_UID.update(corpus.by_uid)
        print(f"  {n} chunks written to SQLite in {time.perf_counter() - t:.1f} s", flush=True)
        texts = real.query_texts[:n_queries]
        qvec = embedder.embed(texts)
        all_vectors, all_ids = corpus.vectors, corpus.chunk_ids
        extra_texts = [f"catch-up passage {i}" for i in range(catch_up_n)]

        for kind in ("hnsw", "milvus"):
            with services.db.write() as session:
                row = collections.get_live(session, cid)
                assert row is not None
                collections.set_index_spec(session, row, kind, {})
            t = time.perf_counter()
            if kind == "hnsw":  # the first open builds it from SQL
                services.indexes.get(cid)
            else:  # built into a new Milvus collection from SQL, then swapped in
                services.indexes.rebuild(cid, kind, {}, snapshot=False).result()
            build_s = time.perf_counter() - t
            # One replica's catch-up: new chunks committed, then applied from the change log.
            # Perturbed copies (synthesize's first rows are the real passages themselves).
            m = len(real.passages)
            extra = synthesize(real.passages, m + catch_up_n, seed=n + len(all_ids))[0][m:]
            extra_ids = append_chunks(services, cid, extra, extra_texts)
            t = time.perf_counter()
            applied = services.indexes.catch_up(cid)
            rate = applied / (time.perf_counter() - t)
            all_vectors = np.concatenate([all_vectors, extra])
            all_ids = np.concatenate([all_ids, extra_ids])
            # The truth over every chunk the collection now holds.
            gt_ids = all_ids[exact_topk(all_vectors, qvec, K)]
            if kind == "hnsw":
                services.indexes.snapshot(cid)  # the server loads it instead of building
            recall, p50, p99, api_rss, note = http_pass(settings, key, cid, texts, gt_ids)
            row_ = Row(
                size=n,
                kind=kind,
                recall=recall,
                p50=p50,
                p99=p99,
                api_rss=api_rss,
                milvus_rss=milvus.rss_mb() if kind == "milvus" else float("nan"),
                build_s=build_s,
                catch_up_per_s=rate,
                note=note,
            )
            rows.append(row_)
            print(
                f"  {n:>7} {kind:<6} recall@10 {recall:.3f} p50 {p50:.1f} ms p99 {p99:.1f} ms "
                f"api {api_rss:.0f} MB build {build_s:.1f} s catch-up {rate:.0f}/s",
                flush=True,
            )
        services.indexes.drop(cid)  # and its Milvus collection
        services.close()
    return rows


# ------------------------------------------------------------------ the queue


def queue_worker(url: str) -> int:
    """A worker process on an empty pipeline: waits for GO on stdin, then drains the queue
    and prints `DONE <jobs> <time of its last job>`."""
    from ingest.pipeline import Chunked, Pipeline
    from ingest.worker import Worker
    from rag.config import IngestSettings
    from rag.db import Database
    from rag.embed import HashEmbedder

    class EmptyPipeline(Pipeline):
        def parse(self, data: bytes, media_type: str) -> str:
            return data.decode()

        def embed(
            self, batch: list[Chunked], pause: Callable[[], None] | None = None
        ) -> list[npt.NDArray[np.float32]]:
            # No model and so no slices to pause between: the bench times the queue alone.
            return [np.zeros((len(c.chunks), self.embedder.dim), np.float32) for c in batch]

    db = Database(url)
    settings = IngestSettings()
    worker = Worker(db, EmptyPipeline(db, HashEmbedder(384), settings), settings)
    print("READY", flush=True)
    sys.stdin.readline()
    last = time.time()
    idle = 0
    while idle < 3:
        if worker.run_once():
            last, idle = time.time(), 0
        else:
            idle += 1
            time.sleep(0.2)
    print(f"DONE {worker.processed} {last}", flush=True)
    db.dispose()
    return 0


def queue(url: str, n_jobs: int) -> list[tuple[int, int, float]]:
    """(workers, jobs, jobs/s) on a fresh PostgreSQL schema."""
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    from rag.auth import create_key
    from rag.db import Database, collections
    from rag.db.migrate import upgrade
    from rag.upload.accept import Incoming, accept

    schema = f"bench_{uuid.uuid4().hex[:10]}"
    admin = create_engine(url, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.execute(text(f'CREATE SCHEMA "{schema}"'))
    except Exception as exc:  # no PostgreSQL: say so, never a figure from nothing
        raise SystemExit(
            f"PostgreSQL not reachable at {make_url(url).render_as_string()} "
            f"({type(exc).__name__}); pass --pg-url, or --skip-queue to measure the rest"
        ) from exc
    scoped = (
        make_url(url)
        .update_query_dict({"options": f"-csearch_path={schema}"})
        .render_as_string(hide_password=False)
    )
    out = []
    try:
        db = Database(scoped)
        upgrade(db)
        _, tenant_id = create_key(db, "bench")
        for workers in (1, 2):
            with db.write() as session:
                cid = collections.create(
                    session,
                    tenant_id,
                    name=f"queue-{workers}",
                    embedding_model="hash-384",
                    embedding_dim=384,
                    chunk_tokens=200,
                    chunk_overlap=32,
                    index_kind="exact",
                    index_params={},
                    search_defaults={},
                ).id
            for start in range(0, n_jobs, 250):
                batch = [
                    Incoming(f"d{i}.txt", f"job {workers}-{i}: a short line.".encode(), None, {})
                    for i in range(start, min(start + 250, n_jobs))
                ]
                accept(db, tenant_id, cid, batch, max_attempts=5)
            procs = [
                subprocess.Popen(
                    [sys.executable, __file__, "--_queue-worker", scoped],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    text=True,
                )
                for _ in range(workers)
            ]
            for p in procs:
                assert p.stdout is not None
                assert p.stdout.readline().strip() == "READY"
            t0 = time.time()
            for p in procs:
                assert p.stdin is not None
                p.stdin.write("GO\n")
                p.stdin.flush()
            done, last = 0, t0
            for p in procs:
                assert p.stdout is not None
                _, jobs_done, t_last = p.stdout.readline().split()
                done += int(jobs_done)
                last = max(last, float(t_last))
                p.wait(timeout=60)
            rate = done / max(last - t0, 1e-9)
            out.append((workers, done, rate))
            print(f"  {workers} worker process(es): {done} jobs, {rate:.0f} jobs/s", flush=True)
        db.dispose()
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))
        admin.dispose()
    return out


# ------------------------------------------------------------------ main


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="small sizes, a few minutes")
    ap.add_argument("--sizes", help="two collection sizes (25000,100000; --quick 5000,20000)")
    ap.add_argument("--queries", type=int, help="HTTP queries per pass (500; --quick 100)")
    ap.add_argument(
        "--catch-up", type=int, help="chunks for the catch-up rate (5000; --quick 1000)"
    )
    ap.add_argument("--jobs", type=int, help="queue jobs per run (4000; --quick 500)")
    ap.add_argument("--pg-url", default=DEFAULT_PG, help="PostgreSQL for the queue figures")
    ap.add_argument("--skip-queue", action="store_true")
    ap.add_argument("--_queue-worker", dest="queue_worker", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.queue_worker:
        return queue_worker(args.queue_worker)
    logging.basicConfig(level=logging.WARNING)
    sizes = [
        int(s) for s in (args.sizes or ("5000,20000" if args.quick else "25000,100000")).split(",")
    ]
    if len(sizes) != 2:
        raise SystemExit("--sizes takes two sizes")
    n_queries = args.queries or (100 if args.quick else 500)
    catch_up_n = args.catch_up or (1000 if args.quick else 5000)
    n_jobs = args.jobs or (500 if args.quick else 4000)

    real = load_real()
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="ragserve-milvus-") as tmp:
        milvus = MilvusLite(Path(tmp))
        try:
            print(f"## POST /search: in-process hnsw vs Milvus ({n_queries} queries)\n", flush=True)
            for n in sizes:
                rows += one_size(real, n, n_queries, milvus, catch_up_n)
        finally:
            milvus.stop()
    print()
    print(
        table(
            [
                "chunks", "kind", "recall@10", "p50 ms", "p99 ms", "API RSS MB",
                "Milvus RSS MB", "build from SQL s", "catch-up chunks/s", "knobs",
            ],
            [
                (
                    r.size, r.kind, r.recall, r.p50, r.p99, r.api_rss,
                    "-" if np.isnan(r.milvus_rss) else r.milvus_rss,
                    r.build_s, r.catch_up_per_s, r.note,
                )
                for r in rows
            ],
        ),
        flush=True,
    )  # fmt: skip
    by = {(r.size, r.kind): r for r in rows}
    small, big = sizes
    per_million = {
        kind: (by[big, kind].api_rss - by[small, kind].api_rss) / (big - small) * 1e6
        for kind in ("hnsw", "milvus")
    }
    print(
        "\nAPI RSS per million chunks, from the two sizes: "
        f"hnsw in process {per_million['hnsw']:.0f} MB; milvus {per_million['milvus']:.0f} MB "
        "(its vectors live in Milvus)\n",
        flush=True,
    )

    claims = float("nan")
    if not args.skip_queue:
        print(f"## PostgreSQL queue, empty pipeline ({n_jobs} jobs per run)\n", flush=True)
        q = queue(args.pg_url, n_jobs)
        print()
        print(table(["worker processes", "jobs", "jobs/s"], q), flush=True)
        claims = q[-1][2]
        print()

    milvus_big = by[big, "milvus"]
    growth = milvus_big.api_rss - by[small, "milvus"].api_rss
    print(f"FIGURE milvus_recall_at_10 {milvus_big.recall:.3f}")
    print(f"FIGURE milvus_p99_ms {milvus_big.p99:.2f}")
    print(f"FIGURE api_rss_growth_mb_25k_to_100k {growth:.1f}")
    print(f"FIGURE queue_claims_per_s_2_workers {claims:.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
