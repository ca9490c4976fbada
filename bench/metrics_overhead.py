"""The cost of turning metrics on: p50 and p99 of POST /search with and without.

    python bench/metrics_overhead.py [--quick] [--passages N] [--rounds R] [--per-round Q]

Two copies of the real app under uvicorn on loopback, over the same SQLite file (docfaq
passages with their precomputed vectors, see bench/quality.py), one with `metrics.enabled`
(latency and status counts per route, stage histograms, /metrics) and one without (which
keeps the request ids: logs need them whatever the metrics setting). Both are warmed up, then the
same queries (the docfaq FAQ questions, embedded by the real model inside each request) are
sent one at a time over keep-alive connections, in interleaved rounds whose order alternates,
so drift on a shared machine hits both sides alike. Ends with
`FIGURE metrics_overhead_pct <(p50 on - p50 off) / p50 off * 100>`.
"""

from __future__ import annotations

import argparse
import logging
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from quality import DOCFAQ, insert_passages, load_passages, md_table  # noqa: E402

from rag.api.loopback import LiveServer  # noqa: E402
from rag.ops import eval as evaluation  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="5,000 passages, 10 rounds")
    parser.add_argument("--passages", type=int, help="corpus size (default: all 23,201)")
    parser.add_argument("--rounds", type=int, help="interleaved rounds (default 30)")
    parser.add_argument("--per-round", type=int, default=40, help="queries per side per round")
    parser.add_argument("--data", default=str(DOCFAQ), help="the docfaq folder")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    root = Path(args.data)
    rounds = args.rounds or (10 if args.quick else 30)
    n_passages = args.passages or (5000 if args.quick else None)

    import httpx

    from rag.api.app import create_app
    from rag.config import Settings
    from rag.embed import SentenceTransformerEmbedder
    from rag.services import build_services

    ids, texts, vectors = load_passages(root)
    if n_passages:
        ids, texts, vectors = ids[:n_passages], texts[:n_passages], vectors[:n_passages]
    queries = list(evaluation.read_queries(root / "queries.jsonl").values())
    embedder = SentenceTransformerEmbedder(device="cpu")

    with tempfile.TemporaryDirectory(prefix="rag-metrics-") as tmp:

        def settings(enabled: bool) -> Settings:
            # One database, an index directory each (each side builds its own index).
            return Settings(
                data_dir=Path(tmp) / ("on" if enabled else "off"),
                database={"url": f"sqlite:///{Path(tmp) / 'rag.db'}"},
                ingest={"in_process_worker": False},
                auth={"admin_key": "bench-admin-key-0123456789"},
                metrics={"enabled": enabled},
                log_level="WARNING",
            )

        sides: dict[str, Any] = {}
        for name, enabled in (("on", True), ("off", False)):
            s = settings(enabled)
            sides[name] = (s, build_services(s, embedder=embedder, announce_admin_key=False))
        t = time.perf_counter()
        key, _, cid = insert_passages(sides["on"][1], "overhead", ids, texts, vectors)
        print(f"  {len(ids)} passages written in {time.perf_counter() - t:.1f} s", flush=True)
        headers = {"Authorization": f"Bearer {key}"}
        url = f"/v1/collections/{cid}/search"
        samples: dict[str, list[float]] = {"on": [], "off": []}
        with (
            LiveServer(create_app(*sides["on"])) as on,
            LiveServer(create_app(*sides["off"])) as off,
            httpx.Client(base_url=on.url, headers=headers, timeout=60) as c_on,
            httpx.Client(base_url=off.url, headers=headers, timeout=60) as c_off,
        ):
            clients = {"on": c_on, "off": c_off}
            for client in clients.values():  # warm-up: index build, model, connections
                for q in queries[:20]:
                    r = client.post(url, json={"query": q, "k": 10})
                    r.raise_for_status()
            qi = 0
            for rnd in range(rounds):
                order = ("on", "off") if rnd % 2 == 0 else ("off", "on")
                batch = [queries[(qi + j) % len(queries)] for j in range(args.per_round)]
                qi += args.per_round
                for name in order:
                    client = clients[name]
                    for q in batch:
                        t0 = time.perf_counter()
                        r = client.post(url, json={"query": q, "k": 10})
                        samples[name].append((time.perf_counter() - t0) * 1000.0)
                        r.raise_for_status()
            # The instrumented side really was instrumented.
            scrape = c_on.get(
                "/metrics", headers={"Authorization": "Bearer bench-admin-key-0123456789"}
            )
            assert scrape.status_code == 200 and "rag_http_responses_total" in scrape.text
            assert c_off.get("/metrics").status_code == 404
        for _, services in sides.values():
            services.close()

    stats = {
        name: (
            float(np.percentile(v, 50)),
            float(np.percentile(v, 99)),
            float(np.mean(v)),
            len(v),
        )
        for name, v in samples.items()
    }
    pct = (stats["on"][0] - stats["off"][0]) / stats["off"][0] * 100.0
    p99_pct = (stats["on"][1] - stats["off"][1]) / stats["off"][1] * 100.0
    print(
        f"\n## Cost of metrics on POST /search ({len(ids)} passages, {rounds} interleaved rounds)\n"
    )
    rows = [(f"metrics {name}", p50, p99, mean, n) for name, (p50, p99, mean, n) in stats.items()]
    rows.append(("difference (%)", pct, p99_pct, "", ""))
    print(md_table(["side", "p50 ms", "p99 ms", "mean ms", "requests"], rows))
    print(
        f"\nuvicorn on loopback, one request at a time, query embedding included (all-MiniLM-L6-v2"
        f" on CPU). Target: p50 difference <= 2%. {platform.platform()}\n"
    )
    print(f"FIGURE metrics_overhead_pct {pct:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
