"""Grounded answers under load: 16 concurrent clients on loopback vs "retrieve, then
transformers generate" one question at a time.

    python bench/ask.py            # 2,000 documents, 128 questions, max_tokens 128
    python bench/ask.py --quick    # 500 documents, 32 questions, max_tokens 64 (< 15 min, 2 cores)

Documents come from ../shared/data/wiki_vital/passages.jsonl (beside the checkout).
Prints a markdown table and, last, `FIGURE answers_per_s_vs_naive <x>` and
`FIGURE invalid_citations <n>` (citations to a passage not given or not visible to the caller).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _data import shared  # noqa: E402
from _sse import events  # noqa: E402

from rag.api.loopback import LiveServer  # noqa: E402
from rag.auth import create_key  # noqa: E402
from rag.config import Settings  # noqa: E402
from rag.engine import EngineSettings, build_engine  # noqa: E402
from rag.services import build_services  # noqa: E402


def load_docs(n: int) -> list[dict[str, str]]:
    docs: list[dict[str, str]] = []
    with shared("wiki_vital", "passages.jsonl").open() as f:
        for line in f:
            row = json.loads(line)
            docs.append({"title": row["title"], "text": row["text"][:700]})
            if len(docs) >= n:
                break
    if len(docs) < n:
        raise SystemExit(f"wiki_vital holds {len(docs)} passages; {n} were asked for")
    return docs


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q / 100 * (len(values) - 1))))]


def ingest(client: httpx.Client, headers: dict[str, str], cid: str, docs: list[dict]) -> None:
    for i in range(0, len(docs), 500):
        batch = [
            {"text": d["text"], "filename": f"{d['title'][:200]}.txt"} for d in docs[i : i + 500]
        ]
        r = client.post(f"/v1/collections/{cid}/documents", json={"documents": batch},
                        headers=headers)  # fmt: skip
        r.raise_for_status()
    while True:
        info = client.get(f"/v1/collections/{cid}", headers=headers).json()
        counts = info["documents"]
        if counts.get("indexed", 0) + counts.get("failed", 0) >= len(docs):
            break
        time.sleep(1)


def ask_one(client: httpx.Client, headers: dict[str, str], cid: str, q: str, max_tokens: int,
            visible: set[str]) -> dict[str, Any]:  # fmt: skip
    t0 = time.perf_counter()
    ttft = None
    given: list[dict] = []
    final: dict[str, Any] = {}
    body = {"question": q, "k": 4, "max_tokens": max_tokens, "stream": True}
    with client.stream("POST", f"/v1/collections/{cid}/ask", json=body, headers=headers) as r:
        r.raise_for_status()
        for event, data in events(r):
            if event == "passages":
                given = data["passages"]
            elif event == "token" and ttft is None:
                ttft = time.perf_counter() - t0
            elif event == "final":
                final = data
    e2e = time.perf_counter() - t0
    ids = {p["chunk_id"] for p in given}
    invalid = sum(
        1
        for c in final.get("citations", [])
        if c["chunk_id"] not in ids or c["chunk_id"] not in visible
    )
    return {"ttft": ttft if ttft is not None else e2e, "e2e": e2e, "invalid": invalid,
            "cited": len(final.get("citations", [])), "usage": final.get("usage", {})}  # fmt: skip


def naive(found: list[tuple[str, Any, float]], max_tokens: int,
          folder: Path) -> list[dict[str, float]]:  # fmt: skip
    """Retrieve, then transformers generate, one question at a time. `found`: each question,
    its passages and the time retrieving them took (measured while the service ran: its
    query embedder closes with it)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, TextIteratorStreamer

    from rag.answer.prompt import messages_for

    tok = AutoTokenizer.from_pretrained(str(folder))
    model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
    out = []
    for q, result, retrieve_s in found:
        t0 = time.perf_counter() - retrieve_s
        text = tok.apply_chat_template(
            messages_for(q, result.passages), tokenize=False, add_generation_prompt=True
        )
        ids = tok(text, return_tensors="pt", add_special_tokens=False)
        streamer = TextIteratorStreamer(tok, skip_prompt=True)
        kwargs = dict(**ids, max_new_tokens=max_tokens, do_sample=False, streamer=streamer)
        worker = threading.Thread(target=model.generate, kwargs=kwargs)
        with torch.inference_mode():
            worker.start()
            ttft = None
            for piece in streamer:
                if piece and ttft is None:
                    ttft = time.perf_counter() - t0
            worker.join()
        e2e = time.perf_counter() - t0
        out.append({"ttft": ttft or e2e, "e2e": e2e})
    return out


def queued(measured: list[dict], n: int, clients: int) -> list[dict]:
    """What the one-at-a-time baseline's clients would see under the same load as ragserve's
    (`clients` asking at once, each asking again when answered, `n` questions): a FIFO server
    whose service times are the measured ones, cycled. TTFT and end-to-end include the wait
    in the queue, as they do for ragserve's clients."""
    free_at = 0.0
    ready = [0.0] * clients  # when each client asks its next question
    out = []
    for i in range(n):
        c = min(range(clients), key=lambda j: ready[j])
        arrival = ready[c]
        run = measured[i % len(measured)]
        start = max(arrival, free_at)
        free_at = start + run["e2e"]
        ready[c] = free_at
        out.append({"ttft": start - arrival + run["ttft"], "e2e": free_at - arrival})
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--docs", type=int)
    ap.add_argument("--questions", type=int)
    ap.add_argument("--naive-questions", type=int)
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--max-tokens", type=int)
    args = ap.parse_args()
    n_docs = args.docs or (500 if args.quick else 2000)
    n_q = args.questions or (32 if args.quick else 128)
    n_naive = args.naive_questions or (8 if args.quick else 32)
    max_tokens = args.max_tokens or (64 if args.quick else 128)

    from rag.engine.loader import resolve_folder

    docs = load_docs(n_docs)
    rng = random.Random(1)
    questions = [f"What is {d['title']}?" for d in rng.sample(docs, min(n_q, len(docs)))]
    while len(questions) < n_q:
        questions.append(questions[len(questions) % max(1, len(docs))])

    with tempfile.TemporaryDirectory() as tmp:
        settings = Settings(
            data_dir=Path(tmp), auth={"admin_key": "bench-admin-key-0123456789"},
            ask={"relevance_threshold": -1.0},
            engine=EngineSettings(max_num_seqs=args.clients, max_num_batched_tokens=512),
        )  # fmt: skip
        engine = build_engine(settings.engine)
        services = build_services(settings, engine=engine, announce_admin_key=False)
        key, tenant_id = create_key(services.db, "bench")
        headers = {"Authorization": f"Bearer {key}"}
        from rag.api.app import create_app

        with LiveServer(create_app(settings, services)) as server:
            client = httpx.Client(base_url=server.url, timeout=600)
            cid = client.post("/v1/collections", json={"name": "bench"},
                              headers=headers).json()["id"]  # fmt: skip
            t = time.perf_counter()
            ingest(client, headers, cid, docs)
            print(f"ingested {n_docs} documents in {time.perf_counter() - t:.1f} s", flush=True)
            from sqlalchemy import select

            from rag.db.models import Chunk, Document

            with services.db.read() as session:
                visible = set(session.scalars(
                    select(Chunk.uid).join(Document, Document.id == Chunk.document_id)
                    .where(Chunk.tenant_id == tenant_id, Document.deleted_at.is_(None))
                ))  # fmt: skip
            ask_one(client, headers, cid, questions[0], 4, visible)  # warm up
            before = engine.metrics()
            t = time.perf_counter()
            with ThreadPoolExecutor(args.clients) as pool:
                clients = [
                    httpx.Client(base_url=server.url, timeout=600) for _ in range(args.clients)
                ]
                served = list(pool.map(
                    lambda iq: ask_one(clients[iq[0] % args.clients], headers, cid, iq[1],
                                       max_tokens, visible),
                    enumerate(questions),
                ))  # fmt: skip
            served_s = time.perf_counter() - t
            after = engine.metrics()
            prompt = sum(r["usage"].get("prompt_tokens", 0) for r in served)
            cached = sum(r["usage"].get("cached_tokens", 0) for r in served)
            print(f"served {len(served)} answers in {served_s:.1f} s", flush=True)
            from rag.knobs import Knobs

            found = []
            for q in questions[:n_naive]:
                t = time.perf_counter()
                result = services.retriever.search(tenant_id, cid, q, Knobs(k=4))
                found.append((q, result, time.perf_counter() - t))
        engine.close()
        t = time.perf_counter()
        folder = resolve_folder(settings.engine.model_path, settings.engine.cache_dir)
        base = naive(found, max_tokens, folder)
        # Its retrieval ran earlier, while the service was up: counted here all the same.
        naive_s = time.perf_counter() - t + sum(retrieve_s for _, _, retrieve_s in found)
        services.close()

    served_aps = len(served) / served_s
    naive_aps = len(base) / naive_s
    invalid = sum(r["invalid"] for r in served)
    rows = [
        (
            f"ragserve, {args.clients} clients",
            served_aps,
            served,
            cached / prompt if prompt else 0.0,
        ),
        ("retrieve + transformers generate, 1 at a time", naive_aps, base, float("nan")),
        (
            f"the same, {args.clients} clients queued at its door (simulated)",
            naive_aps,
            queued(base, len(served), args.clients),
            float("nan"),
        ),
    ]
    print(f"\n{n_docs} documents, {len(served)}/{len(base)} questions, max_tokens {max_tokens}, "
          f"prefix-cache hit rate (engine) {after.prefix_cache_hit_rate:.2f} "
          f"(was {before.prefix_cache_hit_rate:.2f})\n")  # fmt: skip
    print(
        "| setup | answers/s | TTFT p50 (s) | TTFT p99 (s) | end-to-end p99 (s) "
        "| prompt tokens cached |"
    )
    print("|---|---|---|---|---|---|")
    for name, aps, results, hit in rows:
        ttft = [r["ttft"] for r in results]
        e2e = [r["e2e"] for r in results]
        hit_s = "-" if hit != hit else f"{hit:.0%}"
        print(f"| {name} | {aps:.2f} | {statistics.median(ttft):.2f} | {pct(ttft, 99):.2f} | "
              f"{pct(e2e, 99):.2f} | {hit_s} |")  # fmt: skip
    print(f"\ncitations: {sum(r['cited'] for r in served)}, invalid: {invalid}")
    ours_ttft = pct([r["ttft"] for r in served], 99)
    queued_ttft = pct([r["ttft"] for r in rows[2][2]], 99)
    print(
        f"TTFT p99 at the same load: ragserve {ours_ttft:.2f} s, one at a time {queued_ttft:.2f} s"
    )
    print(f"FIGURE answers_per_s_vs_naive {served_aps / naive_aps:.2f}")
    print(f"FIGURE invalid_citations {invalid}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
