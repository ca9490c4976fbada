"""Search queries before ingest: what an upload flood's embedding does to query latency, and
what giving queries priority costs ingest.

    python bench/query_priority.py [--quick] [--chunks N] [--think-ms MS]

The real all-MiniLM-L6-v2 embeds ../shared/data/wiki_vital passages as ingest does (one call
for a claimed batch, on a worker thread) while a client embeds search queries back to back
(with `--think-ms` between them) through the query lane, as /search does. Each setting runs
with the priority off (one long encode call, the worker at the process's priority) and on
(ingest in model batches that wait while queries are in the lane, the worker thread niced):
query latency against queries alone, and ingest chunks/s against ingest alone.
Ends with `FIGURE query_p99_ratio_priority <x>` (p99 under ingest / p99 alone, priority on),
`FIGURE query_p99_ratio_no_priority <x>`, `FIGURE ingest_cost_idle <x>` and
`FIGURE ingest_cost_busy <x>` (ingest chunks/s with the priority on / off, without and with
queries).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _data import shared  # noqa: E402

from ingest.worker import lower_priority  # noqa: E402
from rag.embed import SentenceTransformerEmbedder  # noqa: E402


def load(n: int) -> tuple[list[str], list[str]]:
    with shared("wiki_vital", "passages.jsonl").open() as f:
        rows = [json.loads(line) for _, line in zip(range(2 * n), f, strict=False)]
    chunks = [r["text"] for r in rows[:n]]
    queries = [" ".join(r["text"].split()[:12]) for r in rows[n:]]
    return chunks, queries


def ingest(embedder: SentenceTransformerEmbedder, chunks: list[str], nice: int) -> float:
    """chunks/s of one ingest-sized embed call on a worker thread of its own."""
    took: list[float] = []

    def work() -> None:
        lower_priority(nice)
        t0 = time.perf_counter()
        embedder.embed(chunks)
        took.append(time.perf_counter() - t0)

    thread = threading.Thread(target=work, name="bench-ingest")
    thread.start()
    thread.join()
    return len(chunks) / took[0]


def query_loop(
    embedder: SentenceTransformerEmbedder,
    queries: list[str],
    think_s: float,
    stop: threading.Event,
    latencies: list[float],
) -> None:
    i = 0
    while not stop.is_set():
        t0 = time.perf_counter()
        embedder.embed([queries[i % len(queries)]])
        latencies.append((time.perf_counter() - t0) * 1000.0)
        i += 1
        time.sleep(think_s)


def queries_alone(
    embedder: SentenceTransformerEmbedder, queries: list[str], think_s: float, seconds: float
) -> list[float]:
    latencies: list[float] = []
    stop = threading.Event()
    thread = threading.Thread(target=query_loop, args=(embedder, queries, think_s, stop, latencies))
    thread.start()
    time.sleep(seconds)
    stop.set()
    thread.join()
    return latencies


def contended(
    embedder: SentenceTransformerEmbedder,
    chunks: list[str],
    queries: list[str],
    think_s: float,
    nice: int,
) -> tuple[float, list[float]]:
    latencies: list[float] = []
    stop = threading.Event()
    client = threading.Thread(target=query_loop, args=(embedder, queries, think_s, stop, latencies))
    client.start()
    rate = ingest(embedder, chunks, nice)
    stop.set()
    client.join()
    return rate, latencies


def p(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="256 chunks (default 1024)")
    parser.add_argument("--chunks", type=int, default=None)
    parser.add_argument("--think-ms", type=float, default=20.0)
    args = parser.parse_args()
    n = args.chunks or (256 if args.quick else 1024)
    chunks, queries = load(n)
    think_s = args.think_ms / 1000.0
    embedder = SentenceTransformerEmbedder(device="cpu")
    embedder.embed(["warm up the query lane"])  # waits for the ONNX export
    embedder.embed(chunks[:64] + chunks[:64])  # and the torch path

    alone = queries_alone(embedder, queries, think_s, seconds=3.0)
    rows = []
    for priority in (False, True):
        embedder.query_priority = priority
        nice = 10 if priority else 0
        idle_rate = ingest(embedder, chunks, nice)
        busy_rate, lat = contended(embedder, chunks, queries, think_s, nice)
        rows.append((priority, idle_rate, busy_rate, lat))

    print(f"## Query priority ({n} chunks, a query every {args.think_ms:g} ms + its own time)\n")
    print("| priority | ingest alone (chunks/s) | ingest under queries (chunks/s) | queries | "
          "query p50 (ms) | query p99 (ms) |")  # fmt: skip
    print("|---|---|---|---|---|---|")
    print(f"| queries alone | | | {len(alone)} | {p(alone, 0.5):.1f} | {p(alone, 0.99):.1f} |")
    for priority, idle_rate, busy_rate, lat in rows:
        print(
            f"| {'on' if priority else 'off'} | {idle_rate:.0f} | {busy_rate:.0f} | {len(lat)} | "
            f"{p(lat, 0.5):.1f} | {p(lat, 0.99):.1f} |"
        )
    print(
        "\nOn: ingest embeds in batches of 64 that wait while queries are in the lane, on a "
        "niced thread. Off: one encode call for the whole batch at normal priority.\n"
    )
    (_, idle_off, busy_off, lat_off), (_, idle_on, busy_on, lat_on) = rows
    base = p(alone, 0.99)
    print(f"FIGURE query_p99_ratio_no_priority {p(lat_off, 0.99) / base:.2f}")
    print(f"FIGURE query_p99_ratio_priority {p(lat_on, 0.99) / base:.2f}")
    print(f"FIGURE ingest_cost_idle {idle_on / idle_off:.3f}")
    print(f"FIGURE ingest_cost_busy {busy_on / busy_off:.3f}")
    print(f"FIGURE query_p50_alone_ms {statistics.median(alone):.2f}")
    embedder.close()


if __name__ == "__main__":
    main()
