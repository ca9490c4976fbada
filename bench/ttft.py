"""Time to first token with passage KV reuse (kv_reuse=blend) against the prefix cache alone
(kv_reuse=prefix) and the service's defaults (`default`: evidence first), and what reuse
costs in fidelity against full prefill.

    python bench/ttft.py           # 2,000 documents, 300 + 200 questions, 16 clients x 128,
                                   # fidelity on the 322 docfaq QA pairs
    python bench/ttft.py --quick   # 500 documents, 60 + 60, 16 clients x 32, 40 QA pairs

1. One client, one question at a time, over HTTP (streamed /ask, default settings: 5
   passages, 256 tokens at most, the default weights). Three tenants hold the same wiki_vital
   documents; one asks with kv_reuse=blend and evidence all, one with kv_reuse=prefix and
   evidence all, one with the defaults, the same question in turn (so all see the same
   machine at the same time, and share no cache).
   Questions: three per document from its title and description (templates, fixed seed);
   documents drawn by Zipf (s = 1.1) over a fixed random ranking, so popular documents'
   passages come back as in real traffic. TTFT is the first answer token as the client
   reads it. "seen": every passage of the question was given to an earlier question.
2. 16 clients at once, the same questions for both modes: answers/s and TTFT.
3. Fidelity, in process: each docfaq question (passages by exact search over the corpus
   vectors) answered greedily (64 tokens) once with full prefill and once with its passages'
   KV from the cache, each passage computed beforehand in a prompt of its own (as a warm
   cache holds it). Token-for-token identical answers, the first token's KL divergence
   (full || reuse), and answer token-F1 against the FAQ's answer. Then the recompute share
   (tokens recomputed at the start of each passage) and the storage format swept on a part.

Ends with FIGURE lines: ttft_p50_seen_ms, ttft_p50_default_ms, ttft_p50_vs_prefix,
ttft_cold_vs_prefix, answers_per_s_vs_prefix, greedy_match_vs_full, first_token_kl, answer_f1_delta.

    python bench/ttft.py --contention 40  # in process: a fully cached prompt's first token
                                          # and decode rate, as the service runs, beside a
                                          # spinning query encoder, beside another thread's
                                          # torch team (rag.torch_threads); alternating
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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _data import shared  # noqa: E402
from _reuse import contention, fidelity, in_process, report_fidelity, slots  # noqa: E402
from _sse import events  # noqa: E402
from _stats import pct  # noqa: E402

from rag.api.loopback import LiveServer  # noqa: E402
from rag.auth import create_key  # noqa: E402
from rag.config import Settings  # noqa: E402

TEMPLATES = (
    "What is {title}?",
    "Tell me about {title}, {description}.",
    "What should I know about {title} ({description})?",
)


# ---------------------------------------------------------------- the workload


def load_docs(n: int) -> list[dict[str, str]]:
    docs = []
    with shared("wiki_vital", "passages.jsonl").open() as f:
        for line in f:
            row = json.loads(line)
            docs.append({"title": row["title"], "text": row["text"],
                         "description": row.get("description") or row["topic"]})  # fmt: skip
            if len(docs) >= n:
                break
    if len(docs) < n:
        raise SystemExit(f"wiki_vital holds {len(docs)} passages; {n} were asked for")
    return docs


def zipf_questions(docs: list[dict[str, str]], n: int, seed: int = 11, s: float = 1.1) -> list[str]:
    rng = random.Random(seed)
    ranking = list(range(len(docs)))
    rng.shuffle(ranking)
    weights = [1.0 / (r + 1) ** s for r in range(len(docs))]
    picks = rng.choices(ranking, weights=weights, k=n)
    out = []
    for d in picks:
        doc = docs[d]
        template = TEMPLATES[rng.randrange(len(TEMPLATES))]
        out.append(template.format(title=doc["title"], description=doc["description"]))
    return out


def ingest(client: httpx.Client, headers: dict[str, str], cid: str, docs: list[dict]) -> None:
    for i in range(0, len(docs), 500):
        batch = [{"text": d["text"], "filename": f"{d['title'][:200]}.txt"}
                 for d in docs[i : i + 500]]  # fmt: skip
        r = client.post(f"/v1/collections/{cid}/documents", json={"documents": batch},
                        headers=headers)  # fmt: skip
        r.raise_for_status()
    while True:
        counts = client.get(f"/v1/collections/{cid}", headers=headers).json()["documents"]
        if counts.get("indexed", 0) + counts.get("failed", 0) >= len(docs):
            return
        time.sleep(1)


@dataclass
class Answer:
    ttft_ms: float
    e2e_ms: float
    passages: list[str]  # texts of the passages given, to tell seen from unseen
    usage: dict[str, Any]
    timings: dict[str, float]
    canned: bool
    seen: bool = False


def ask(client: httpx.Client, headers: dict[str, str], cid: str, question: str, mode: str,
        max_tokens: int | None = None) -> Answer:  # fmt: skip
    body: dict[str, Any] = {"question": question, "stream": True}
    if mode != "default":  # "default": the service's defaults (evidence first, one passage)
        body.update(kv_reuse=mode, evidence="all")
    if max_tokens is not None:
        body["max_tokens"] = max_tokens
    t0 = time.perf_counter()
    ttft = None
    given: list[str] = []
    final: dict[str, Any] = {}
    with client.stream("POST", f"/v1/collections/{cid}/ask", json=body, headers=headers) as r:
        r.raise_for_status()
        for event, data in events(r):
            if event == "passages":
                given = [p["text"] for p in data["passages"]]
            elif event == "token" and ttft is None and data.get("text"):
                ttft = (time.perf_counter() - t0) * 1000
            elif event == "final":
                final = data
    e2e = (time.perf_counter() - t0) * 1000
    reason = final.get("finish_reason", "")
    if reason == "error":
        raise RuntimeError(f"the answer failed: {final}")
    canned = reason in ("no_passages", "not_indexed")
    return Answer(ttft if ttft is not None else e2e, e2e, given, final.get("usage", {}),
                  final.get("timings_ms", {}), canned)  # fmt: skip


# The arms of the one-client part: passage KV reuse, the prefix cache alone (both with the
# multi-passage prompt), and the service's defaults (evidence first: the quote, then one
# generated sentence over one passage, whose KV the prefix cache reuses exactly).
MODES = ("blend", "prefix", "default")


# ---------------------------------------------------------------- the run


def split(answers: list[Answer]) -> dict[str, list[float]]:
    live = [a for a in answers if not a.canned]
    return {
        "all": [a.ttft_ms for a in live],
        "seen": [a.ttft_ms for a in live if a.seen],
        "unseen": [a.ttft_ms for a in live if not a.seen],
    }


def concurrent(server_url: str, headers: dict[str, str], cid: str, questions: list[str],
               mode: str, clients: int, max_tokens: int) -> tuple[float, list[Answer]]:  # fmt: skip
    lock = threading.Lock()
    queue = list(reversed(questions))
    out: list[Answer] = []

    def client_loop() -> None:
        with httpx.Client(base_url=server_url, timeout=600) as c:
            while True:
                with lock:
                    if not queue:
                        return
                    q = queue.pop()
                a = ask(c, headers, cid, q, mode, max_tokens)
                with lock:
                    out.append(a)

    t0 = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        for f in [pool.submit(client_loop) for _ in range(clients)]:
            f.result()
    return len(out) / (time.perf_counter() - t0), out


def contention_only(n: int) -> int:
    with in_process() as services:
        ms = contention(services, n)
    print(f"\n## A fully cached prompt's first token after its query, in process ({n} docfaq "
          "questions)\n")  # fmt: skip
    print("| beside the engine's step | first token median ms | p90 ms | decode tokens/s "
          "(median) |")  # fmt: skip
    print("|---|---|---|---|")
    for label, (firsts, rates) in ms.items():
        print(f"| {label} | {statistics.median(firsts):.0f} | {pct(firsts, 90):.0f} | "
              f"{statistics.median(rates):.1f} |")  # fmt: skip
    none = ms["none"]

    def slowdown(case: str) -> float:
        return statistics.median(ms[case][0]) / statistics.median(none[0])

    decode = statistics.median(none[1]) / statistics.median(ms["lingering torch team"][1])
    print()
    print(f"FIGURE cached_first_token_ms {statistics.median(none[0]):.1f}")
    print(f"FIGURE spinning_encoder_slowdown {slowdown('spinning query encoder'):.3f}")
    print(f"FIGURE lingering_team_slowdown {slowdown('lingering torch team'):.3f}")
    print(f"FIGURE decode_speedup_without_team {decode:.3f}")
    return 0


def slots_only(n: int) -> int:
    with in_process() as services:
        kls = slots(services, n)
    print(f"\n## First-token KL by the slot of the one passage taken from the cache ({n} "
          "docfaq questions)\n")  # fmt: skip
    print("| passage from the cache | KL mean | KL median |")
    print("|---|---|---|")
    for label, values in kls.items():
        print(f"| {label} | {statistics.mean(values):.4f} | {statistics.median(values):.4f} |")
    print()
    print(f"FIGURE slots_kl_all {statistics.mean(kls['all of them']):.4f}")
    but_last = statistics.mean(kls["all but the last (computed in place)"])
    print(f"FIGURE slots_kl_all_but_last {but_last:.4f}")
    return 0


def fidelity_only(n: int, sweep_n: int) -> int:
    with in_process() as services:
        fid = fidelity(services, n, sweep_n, 64)
    report_fidelity(fid)
    b = fid["base"]
    print()
    print(f"FIGURE greedy_match_vs_full {b['same']:.3f}")
    print(f"FIGURE first_token_kl {b['kl_mean']:.4f}")
    print(f"FIGURE answer_f1_delta {b['f1_delta']:+.4f}")
    print(f"FIGURE answer_f1_delta_se {b['f1_delta_se']:.4f}")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--docs", type=int)
    ap.add_argument("--warmup", type=int)
    ap.add_argument("--measured", type=int)
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--concurrent-questions", type=int)
    ap.add_argument("--fidelity", type=int, help="docfaq QA pairs (default: all 322)")
    ap.add_argument("--sweep", type=int, help="QA pairs of the recompute sweep")
    ap.add_argument("--fidelity-only", action="store_true",
                    help="only part 3 (in process, no server): for iterating on reuse")  # fmt: skip
    ap.add_argument("--slots", type=int, metavar="N",
                    help="only the KL of reuse by passage slot, over N QA pairs")  # fmt: skip
    ap.add_argument("--contention", type=int, metavar="N",
                    help="only a cached prompt's first token beside a spinning query encoder "
                         "or another thread's torch team, over N QA pairs")  # fmt: skip
    ap.add_argument(
        "--max-tokens",
        type=int,
        default=32,
        help="answer length in the one-client phase (TTFT does not depend on it)",
    )
    args = ap.parse_args()
    n_docs = args.docs or (500 if args.quick else 2000)
    n_warm = args.warmup if args.warmup is not None else (60 if args.quick else 300)
    n_meas = args.measured or (60 if args.quick else 200)
    n_conc = args.concurrent_questions or (32 if args.quick else 128)
    n_fid = args.fidelity or (40 if args.quick else 322)
    n_sweep = args.sweep if args.sweep is not None else (16 if args.quick else 60)

    if args.slots:
        return slots_only(args.slots)
    if args.contention:
        return contention_only(args.contention)
    if args.fidelity_only:
        return fidelity_only(n_fid, min(n_sweep, n_fid))
    docs = load_docs(n_docs)
    questions = zipf_questions(docs, n_warm + n_meas + n_conc)
    with tempfile.TemporaryDirectory() as tmp:
        settings = Settings(data_dir=Path(tmp), auth={"admin_key": "bench-admin-key-0123456789"})
        from rag.api.app import create_app
        from rag.services import build_services

        services = build_services(settings, announce_admin_key=False)
        with LiveServer(create_app(settings, services)) as server:
            client = httpx.Client(base_url=server.url, timeout=600)
            tenants = {}
            for mode in MODES:
                key, _ = create_key(services.db, f"bench-{mode}")
                headers = {"Authorization": f"Bearer {key}"}
                cid = client.post("/v1/collections", json={"name": "wiki"},
                                  headers=headers).json()["id"]  # fmt: skip
                t = time.perf_counter()
                ingest(client, headers, cid, docs)
                print(f"{mode}: ingested {n_docs} documents in {time.perf_counter() - t:.0f} s",
                      flush=True)  # fmt: skip
                tenants[mode] = (headers, cid)
            _ = services.engine  # loaded (the API loads it at start; wait for it here)

            # 1. One client.
            seen_texts: dict[str, set[str]] = {mode: set() for mode in MODES}
            answers: dict[str, list[Answer]] = {mode: [] for mode in MODES}
            t = time.perf_counter()
            for i, q in enumerate(questions[: n_warm + n_meas]):
                order = MODES[i % len(MODES) :] + MODES[: i % len(MODES)]
                for mode in order:
                    headers, cid = tenants[mode]
                    a = ask(client, headers, cid, q, mode, args.max_tokens)
                    a.seen = bool(a.passages) and all(p in seen_texts[mode] for p in a.passages)
                    seen_texts[mode].update(a.passages)
                    if i >= n_warm:
                        answers[mode].append(a)
                if (i + 1) % 50 == 0:
                    print(f"  one client: {i + 1}/{n_warm + n_meas} questions "
                          f"({time.perf_counter() - t:.0f} s)", flush=True)  # fmt: skip
            m = services.engine.metrics().passages
            cache_line = (f"passage cache after the one-client phase: {m.entries} entries, "
                          f"{m.bytes / 2**20:.0f} MB, {m.hits} hits, {m.misses} misses, "
                          f"{m.evictions} evictions")  # fmt: skip
            print(cache_line, flush=True)

            # 2. Sixteen clients.
            conc = {}
            rest = questions[n_warm + n_meas :]
            for mode in ("prefix", "blend"):
                headers, cid = tenants[mode]
                rate, out = concurrent(server.url, headers, cid, rest, mode, args.clients, 128)
                conc[mode] = (rate, out)
                print(f"  {args.clients} clients, {mode}: {rate:.2f} answers/s", flush=True)

            # 3. Fidelity, in process.
            print("fidelity ...", flush=True)
            fid = fidelity(services, n_fid, min(n_sweep, n_fid), 64)
            client.close()
        services.close()

    # ---------------------------------------------------------------- report
    print()
    print(f"## TTFT, one client ({n_docs} documents, {n_warm} warm-up + {n_meas} measured "
          "questions, Zipf s=1.1, the same questions for both modes)\n")  # fmt: skip
    print("| kv_reuse | questions | share | TTFT p50 ms | p90 ms | p99 ms | computed prompt "
          "tokens (mean) |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    tables = {mode: split(answers[mode]) for mode in answers}
    for part in ("all", "seen", "unseen"):
        for mode in MODES:
            xs = tables[mode][part]
            live = [a for a in answers[mode] if not a.canned and (
                part == "all" or a.seen == (part == "seen"))]  # fmt: skip
            comp = statistics.mean(
                a.usage.get("computed_tokens", 0) + a.usage.get("recomputed_tokens", 0)
                for a in live
            ) if live else float("nan")  # fmt: skip
            share = len(xs) / max(1, len(tables[mode]["all"]))
            print(f"| {mode} ({part}) | {len(xs)} | {share:.2f} | {pct(xs, 50):.0f} | "
                  f"{pct(xs, 90):.0f} | {pct(xs, 99):.0f} | {comp:.0f} |")  # fmt: skip
    canned = sum(a.canned for a in answers["blend"])
    print(f"\n{canned} of {n_meas} questions had no passage above the relevance threshold "
          "(answered without the generator; left out above).")  # fmt: skip
    print(cache_line)
    stages: dict[str, list[float]] = {}
    for a in answers["blend"]:
        if a.seen and not a.canned:
            for k, v in a.timings.items():
                stages.setdefault(k, []).append(v)
    if stages:
        print("\nserver-side stages of seen blend questions (median ms): " + ", ".join(
            f"{k} {statistics.median(v):.1f}" for k, v in sorted(stages.items())
            if "." not in k))  # fmt: skip

    print(f"\n## {args.clients} concurrent clients ({n_conc} questions each mode, 128 tokens)\n")
    print("| kv_reuse | answers/s | TTFT p50 ms | TTFT p99 ms |")
    print("|---|---|---|---|")
    for mode in ("blend", "prefix"):
        rate, out = conc[mode]
        xs = [a.ttft_ms for a in out if not a.canned]
        print(f"| {mode} | {rate:.2f} | {pct(xs, 50):.0f} | {pct(xs, 99):.0f} |")

    report_fidelity(fid)
    seen_p50 = pct(tables["blend"]["seen"], 50)
    ratio = pct(tables["blend"]["all"], 50) / pct(tables["prefix"]["all"], 50)
    cold = pct(tables["blend"]["unseen"], 50) / pct(tables["prefix"]["unseen"], 50)
    print()
    print(f"FIGURE ttft_p50_seen_ms {seen_p50:.1f}")
    print(f"FIGURE ttft_p50_default_ms {pct(tables['default']['all'], 50):.1f}")
    print(f"FIGURE ttft_p50_vs_prefix {ratio:.3f}")
    print(f"FIGURE ttft_cold_vs_prefix {cold:.3f}")
    print(f"FIGURE answers_per_s_vs_prefix {conc['blend'][0] / conc['prefix'][0]:.3f}")
    b = fid["base"]
    print(f"FIGURE greedy_match_vs_full {b['same']:.3f}")
    print(f"FIGURE first_token_kl {b['kl_mean']:.4f}")
    print(f"FIGURE answer_f1_delta {b['f1_delta']:+.4f}")
    print(f"FIGURE answer_f1_delta_se {b['f1_delta_se']:.4f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
