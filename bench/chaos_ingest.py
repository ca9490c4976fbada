"""Chaos: SIGKILL the ingest worker N times under a steady upload stream, then audit.

    python bench/chaos_ingest.py [--quick] [--cycles 100] [--db sqlite|postgres URL]

Uploads go over real HTTP to the API (no in-process worker); a separate `rag worker`
process is started and killed with SIGKILL after a random 0.5-2 s, N times; then one worker
drains the queue and the audit checks every acknowledged upload is `indexed` exactly once.
Ends with `FIGURE lost <n>` and `FIGURE duplicated <n>`.
"""

from __future__ import annotations

import argparse
import random
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fastapi.testclient import TestClient  # noqa: E402

from rag.api.app import create_app  # noqa: E402
from rag.config import Settings  # noqa: E402
from rag.embed import HashEmbedder, SentenceTransformerEmbedder  # noqa: E402
from rag.services import build_services  # noqa: E402
from tests.support.audit import audit, pending_jobs, spawn_worker  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="100 cycles (3-4 min), hash embedder")
    parser.add_argument("--cycles", type=int)
    parser.add_argument("--db", help="database URL (default: a SQLite file in a temp dir)")
    parser.add_argument(
        "--real-model",
        action="store_true",
        help="embed with all-MiniLM-L6-v2 (slower worker starts)",
    )
    args = parser.parse_args()
    cycles = args.cycles or 100  # the headline figure is 100 cycles; --quick changes nothing here
    rng = random.Random(11)

    with tempfile.TemporaryDirectory() as tmp:
        settings = Settings(
            data_dir=Path(tmp),
            database={"url": args.db},
            auth={"admin_key": "bench-admin-key-0123456789"},
            embed={"backend": "sentence-transformers" if args.real_model else "hash"},
            ingest={"in_process_worker": False},
        )
        embedder = SentenceTransformerEmbedder() if args.real_model else HashEmbedder()
        services = build_services(settings, embedder=embedder)
        url = services.db.url.render_as_string(hide_password=False)
        worker_env = {
            "RAG_EMBED__BACKEND": settings.embed.backend,
            "RAG_INGEST__ADVANCED__LEASE_S": "1.0",
            "RAG_INGEST__ADVANCED__POLL_INTERVAL_S": "0.05",
            "RAG_INGEST__ADVANCED__BACKOFF_BASE_S": "0.05",
            "RAG_AUTH__ADMIN_KEY": "bench-admin-key-0123456789",
        }
        headers = {"Authorization": "Bearer bench-admin-key-0123456789"}
        acknowledged: set[str] = set()
        stop = threading.Event()
        with TestClient(create_app(settings, services)) as client:
            cid = client.post("/v1/collections", json={"name": "chaos"}, headers=headers).json()[
                "id"
            ]

            def uploader() -> None:
                i = 0
                while not stop.is_set():
                    words = " ".join(
                        f"w{rng.randrange(50_000)}" for _ in range(rng.randrange(50, 2000))
                    )
                    r = client.post(
                        f"/v1/collections/{cid}/documents",
                        headers=headers,
                        json={"text": f"upload {i}: {words}"},
                    )
                    if r.status_code == 202:
                        acknowledged.add(r.json()["documents"][0]["document_id"])
                    i += 1
                    time.sleep(0.02)

            thread = threading.Thread(target=uploader)
            thread.start()
            t0 = time.perf_counter()
            for n in range(cycles):
                proc = spawn_worker(url, tmp, **worker_env)
                time.sleep(rng.uniform(0.5, 2.0))
                proc.send_signal(signal.SIGKILL)
                proc.wait()
                if (n + 1) % 10 == 0:
                    print(f"  {n + 1} kills, {len(acknowledged)} uploads acknowledged", flush=True)
            stop.set()
            thread.join()
            proc = spawn_worker(url, tmp, **worker_env)
            deadline = time.monotonic() + 600
            while pending_jobs(services.db) and time.monotonic() < deadline:
                time.sleep(0.2)
            proc.terminate()
            proc.wait(timeout=60)
            elapsed = time.perf_counter() - t0
            result = audit(services.db, acknowledged)
    print("| cycles | acknowledged | indexed | lost | duplicated | seconds |")
    print("|---|---|---|---|---|---|")
    print(
        f"| {cycles} | {result.acknowledged} | {result.indexed} | {result.lost} | "
        f"{result.duplicated} | {elapsed:.0f} |"
    )
    print(f"FIGURE acknowledged {result.acknowledged}")
    print(f"FIGURE indexed {result.indexed}")
    print(f"FIGURE lost {result.lost}")
    print(f"FIGURE duplicated {result.duplicated}")


if __name__ == "__main__":
    main()
