"""Ingest throughput end to end (upload → indexed, chunks/s) against bare
SentenceTransformer.encode on the same chunks, in the same run.

    python bench/ingest.py [--quick] [--docs N] [--passages-per-doc P]

Documents are built from ../shared/data/wiki_vital passages (the bench exits when that is
absent). The pipeline run goes through the real HTTP app, the real worker and SQLite; the
baseline encodes exactly the chunk texts the pipeline produced, with the same model, batch
size and threads. Uploads start once the service is ready (its generator loaded), as a user's
would after `rag serve` has started. Ends with `FIGURE ingest_vs_encode <ratio>`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _data import shared  # noqa: E402
from fastapi.testclient import TestClient  # noqa: E402
from sqlalchemy import select  # noqa: E402

from rag.api.app import create_app  # noqa: E402
from rag.config import Settings  # noqa: E402
from rag.db.models import Chunk  # noqa: E402
from rag.embed import SentenceTransformerEmbedder  # noqa: E402
from rag.services import build_services  # noqa: E402


def load_passages(n: int) -> list[str]:
    with shared("wiki_vital", "passages.jsonl").open() as f:
        rows = [json.loads(line) for _, line in zip(range(n), f, strict=False)]
    return [f"{r['title']}\n\n{r['text']}" for r in rows]


def make_documents(n_docs: int, per_doc: int) -> list[str]:
    passages = load_passages(n_docs * per_doc)
    return ["\n\n".join(passages[i * per_doc : (i + 1) * per_doc]) for i in range(n_docs)]


def run_pipeline(
    docs: list[str], embedder: SentenceTransformerEmbedder, workdir: Path
) -> tuple[float, list[str]]:
    settings = Settings(
        data_dir=workdir,
        auth={"admin_key": "bench-admin-key-0123456789"},
        ingest={"advanced": {"poll_interval_s": 0.05}},
    )
    services = build_services(settings, embedder=embedder)
    headers = {"Authorization": "Bearer bench-admin-key-0123456789"}
    with TestClient(create_app(settings, services)) as client:
        wait_ready(client)
        cid = client.post("/v1/collections", json={"name": "bench"}, headers=headers).json()["id"]
        t0 = time.perf_counter()
        jobs = []
        for i, text in enumerate(docs):
            r = client.post(
                f"/v1/collections/{cid}/documents",
                headers=headers,
                json={"text": text, "filename": f"doc{i}.txt"},
            )
            jobs.append(r.json()["documents"][0]["job_id"])
        for job in jobs:
            while not client.get(f"/v1/jobs/{job}", params={"wait": 30}, headers=headers).json()[
                "done"
            ]:
                pass
        elapsed = time.perf_counter() - t0
        with services.db.read() as s:
            texts = list(s.scalars(select(Chunk.text).order_by(Chunk.id)))
    return elapsed, texts


def wait_ready(client: TestClient, timeout_s: float = 600.0) -> None:
    """Until the service has loaded its generator: start-up loads and calibrates it in the
    background, which would otherwise share the cores with the ingest being timed."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        r = client.get("/readyz")
        if r.status_code == 200 and r.json()["checks"]["generator"]["loaded"]:
            return
        time.sleep(0.5)
    raise SystemExit("the service did not load its generator")


def run_bare(texts: list[str], embedder: SentenceTransformerEmbedder) -> float:
    t0 = time.perf_counter()
    embedder._model.encode(
        texts,
        batch_size=embedder.batch_size,
        convert_to_numpy=True,
        normalize_embeddings=True,
        show_progress_bar=False,
    )
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="a few minutes on 2 cores")
    parser.add_argument("--docs", type=int)
    parser.add_argument("--passages-per-doc", type=int, default=8)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    args = parser.parse_args()
    n_docs = args.docs or (60 if args.quick else 400)

    import torch

    torch.set_num_threads(args.threads)
    embedder = SentenceTransformerEmbedder(device="auto", batch_size=64)
    docs = make_documents(n_docs, args.passages_per_doc)
    embedder.embed(["warm up the model"] * 8)

    with tempfile.TemporaryDirectory() as tmp:
        pipe_s, texts = run_pipeline(docs, embedder, Path(tmp))
    bare_s = run_bare(texts, embedder)
    pipe_rate = len(texts) / pipe_s
    bare_rate = len(texts) / bare_s
    ratio = pipe_rate / bare_rate
    print(
        f"documents {len(docs)}, chunks {len(texts)}, device {embedder.device}, "
        f"threads {args.threads}"
    )
    print("| path | seconds | chunks/s |")
    print("|---|---|---|")
    print(f"| ragserve upload → indexed | {pipe_s:.1f} | {pipe_rate:.1f} |")
    print(f"| bare SentenceTransformer.encode | {bare_s:.1f} | {bare_rate:.1f} |")
    print(f"FIGURE ingest_vs_encode {ratio:.3f}")


if __name__ == "__main__":
    main()
