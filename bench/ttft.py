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
import asyncio
import contextlib
import dataclasses
import json
import math
import os
import random
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _data import shared  # noqa: E402
from _docfaq import DocFaq, token_f1  # noqa: E402
from _sse import events  # noqa: E402

from rag.api.loopback import LiveServer  # noqa: E402
from rag.auth import create_key  # noqa: E402
from rag.config import Settings  # noqa: E402

TEMPLATES = (
    "What is {title}?",
    "Tell me about {title}, {description}.",
    "What should I know about {title} ({description})?",
)


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q / 100 * (len(values) - 1))))]


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


# ---------------------------------------------------------------- fidelity


class Capture:
    """Wraps the runner's sampler: keeps the log-probabilities of each request's first
    sampled token (the first token's distribution), passes everything through."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.first: dict[str, Any] = {}

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def __call__(self, logits: Any, request_ids: list[str], params: Any) -> Any:
        import torch

        for i, rid in enumerate(request_ids):
            if rid not in self.first:
                self.first[rid] = torch.log_softmax(logits[i].float(), dim=-1)
        return self.inner(logits, request_ids, params)


def first_token_kl(p: Any, q: Any) -> float:
    """KL(p || q) of two first-token log-probability rows (full prefill's first)."""
    import torch

    return float(torch.sum(p.exp() * (p - q)).item())


@dataclass
class Run:
    tokens: list[int] = field(default_factory=list)
    text: str = ""
    usage: Any = None
    ttft_ms: float = 0.0
    total_ms: float = 0.0


async def generate(engine: Any, prompt: Any, rid: str, n: int, salt: str) -> Run:
    from rag.engine.sequence import SamplingParams

    run = Run()
    t0 = time.perf_counter()
    async for ev in engine.submit(prompt, SamplingParams(max_tokens=n), rid, cache_salt=salt):
        if ev.token_ids and not run.tokens:
            run.ttft_ms = (time.perf_counter() - t0) * 1000
        run.tokens += list(ev.token_ids)
        run.text += ev.text
        if ev.finish_reason is not None:
            run.usage = ev.usage
    run.total_ms = (time.perf_counter() - t0) * 1000
    return run


def fidelity(services: Any, n_questions: int, sweep_n: int, new_tokens: int) -> dict[str, Any]:
    """Greedy answers with reused passage KV against full prefill, per docfaq question."""
    import torch

    from rag.answer import prompt as prompts

    engine = services.engine
    capture = Capture(engine.runner.sampler)
    engine.runner.sampler = capture
    faq = DocFaq()
    qa = faq.qa[:n_questions]
    context = engine.context_tokens

    def kl(full_rid: str, reuse_rid: str) -> float:
        """KL(full || reuse) of the first token; the full run's distribution is kept."""
        return first_token_kl(capture.first[full_rid], capture.first.pop(reuse_rid))

    async def one(i: int, item: Any, full: Run | None, tag: str) -> tuple[Run, Run, float]:
        passages = faq.retrieve(services.embedder, item.question, k=5)
        built = prompts.build(item.question, passages, context_tokens=context,
                              max_tokens=new_tokens, count=engine.count_tokens,
                              salt=f"fid-{tag}")  # fmt: skip
        given = passages[: built.given]
        if WARM == "context":
            # As live traffic stores them: computed in an earlier prompt over the same
            # passages in the reverse order (another question about the same documents).
            earlier = prompts.build("What do these passages say?", given[::-1],
                                    context_tokens=context, max_tokens=new_tokens,
                                    count=engine.count_tokens, salt=f"fid-{tag}")  # fmt: skip
            rid = f"warm-{tag}-{i}"
            await generate(engine, earlier.prompt, rid, 1, f"{tag}-earlier-{i}")
            capture.first.pop(rid, None)
        # Each passage's KV computed on its own first, as a warm cache holds it.
        for p in given if WARM != "context" else ():
            alone = prompts.segmented("", [p], salt=f"fid-{tag}", kv_reuse="blend")
            if engine.passages.tokens_of(alone.segments[0].key) is None:
                await generate(engine, alone, f"warm-{tag}-{i}-{p.chunk_id}", 1, tag)
                capture.first.pop(f"warm-{tag}-{i}-{p.chunk_id}", None)
        reuse = await generate(engine, built.prompt, f"reuse-{tag}-{i}", new_tokens, tag)
        if full is None:
            exact = prompts.build(item.question, passages, context_tokens=context,
                                  max_tokens=new_tokens, count=engine.count_tokens,
                                  salt=f"fid-{tag}", kv_reuse="off")  # fmt: skip
            full = await generate(engine, exact.prompt, f"full-base-{i}", new_tokens, tag)
        return reuse, full, kl(f"full-base-{i}", f"reuse-{tag}-{i}")

    async def main() -> dict[str, Any]:
        rows = []
        fulls: dict[int, Run] = {}
        for i, item in enumerate(qa):
            reuse, full, div = await one(i, item, None, "base")
            fulls[i] = full
            rows.append(_row(reuse, full, div, item.answer))
            if (i + 1) % 20 == 0:
                print(f"  fidelity {i + 1}/{len(qa)}", flush=True)
        base = _summary(rows)
        # The recompute share and storage format, on the first `sweep_n` questions (their
        # full-prefill answers computed once, above).
        sweep = []
        cfg = engine.scheduler.config
        default_first = cfg.recompute_first
        # (how, amount, stored): "first" recomputes each passage's first `amount` tokens,
        # "deviation" the share `amount` whose values deviate most after the first layer.
        choices = sweep_choices(default_first) if sweep_n else []
        for how, amount, stored in choices:
            # "last": the default recompute, and the last `amount` passages computed whole.
            engine.scheduler.config = dataclasses.replace(
                cfg, recompute="deviation" if how == "deviation" else "first",
                recompute_first={"first": int(amount), "last": default_first}.get(how, 0),
                recompute_ratio=float(amount) if how == "deviation" else 0.0,
                recompute_last=int(amount) if how == "last" else 0,
            )  # fmt: skip
            old_dtype = engine.passages.dtype
            if stored is not None:
                engine.passages.dtype = getattr(torch, stored)
            engine.passages.clear()
            tag = f"s{how}{amount}{stored or ''}"
            part = []
            for i, item in enumerate(qa[:sweep_n]):
                full = fulls[i]
                reuse, _, div = await one(i, item, full, tag)
                part.append(_row(reuse, full, div, item.answer))
            engine.passages.dtype = old_dtype
            summary = _summary(part)
            label = "all" if how == "first" and amount >= 100_000 else recompute_label(
                engine.scheduler.config)  # fmt: skip
            summary.update(label=label, stored=stored or str(old_dtype).removeprefix("torch."))
            sweep.append(summary)
            print(f"  sweep {label} ({summary['stored']}): identical {summary['same']:.3f}, "
                  f"KL {summary['kl_mean']:.4f}", flush=True)  # fmt: skip
        engine.scheduler.config = cfg
        engine.passages.clear()
        return {"base": base, "sweep": sweep, "n": len(qa), "sweep_n": sweep_n,
                "label": recompute_label(cfg)}  # fmt: skip

    try:
        return asyncio.run(main())
    finally:
        engine.runner.sampler = capture.inner


def recompute_label(cfg: Any) -> str:
    """What a scheduler config recomputes of reused passages, as the tables name it."""
    label = (f"first {cfg.recompute_first}" if cfg.recompute == "first"
             else f"deviation {cfg.recompute_ratio:.0%}")  # fmt: skip
    if cfg.recompute_last:
        label += f", last {cfg.recompute_last} whole"
    return label


SWEEP = os.environ.get("TTFT_SWEEP")  # e.g. "first:8,deviation:0.15,last:1": only these
# How the passages' KV gets into the cache before a question: "alone" (each computed in a
# prompt of its own: the protocol, the harder case) or "context" (stored by an earlier
# prompt over the same passages in another order, as live traffic stores them).
WARM = os.environ.get("TTFT_WARM", "alone")


def sweep_choices(default_first: int) -> list[tuple[str, float, str | None]]:
    if SWEEP:
        out: list[tuple[str, float, str | None]] = []
        for item in SWEEP.split(","):
            how, amount = item.split(":")
            out.append((how, float(amount), None))
        return out
    return [
        ("first", 0, None), ("first", 4, None), ("first", default_first, None),
        ("first", 32, None), ("deviation", 0.05, None), ("deviation", 0.15, None),
        ("deviation", 0.3, None), ("first", 100_000, None), ("first", default_first, "bfloat16"),
    ]  # fmt: skip


def _row(reuse: Run, full: Run, div: float, answer: str) -> dict[str, Any]:
    """One question of the fidelity part: the reuse run against full prefill."""
    return {
        "same": reuse.tokens == full.tokens, "kl": div,
        "f1_reuse": token_f1(reuse.text, answer), "f1_full": token_f1(full.text, answer),
        "ttft_reuse": reuse.ttft_ms, "ttft_full": full.ttft_ms,
        "computed": _computed(reuse.usage), "prompt": reuse.usage.prompt_tokens,
    }  # fmt: skip


def _computed(usage: Any) -> int:
    return int(usage.prompt_tokens - usage.cached_prompt_tokens - usage.reused_prompt_tokens)


def _summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    kls = [r["kl"] for r in rows if not math.isnan(r["kl"])]
    # The F1 difference is paired (the same question both ways): its standard error says
    # whether a gap of 0.01 can be told from noise at this many questions.
    diffs = [r["f1_reuse"] - r["f1_full"] for r in rows]
    se = statistics.stdev(diffs) / math.sqrt(len(diffs)) if len(diffs) > 1 else float("nan")
    return {
        "same": sum(r["same"] for r in rows) / len(rows),
        "kl_mean": statistics.mean(kls) if kls else float("nan"),
        "kl_p90": pct(kls, 90) if kls else float("nan"),
        "f1_reuse": statistics.mean(r["f1_reuse"] for r in rows),
        "f1_full": statistics.mean(r["f1_full"] for r in rows),
        "f1_delta": statistics.mean(diffs),
        "f1_delta_se": se,
        "ttft_reuse": statistics.median(r["ttft_reuse"] for r in rows),
        "ttft_full": statistics.median(r["ttft_full"] for r in rows),
        "computed": statistics.mean(r["computed"] for r in rows),
        "prompt": statistics.mean(r["prompt"] for r in rows),
    }


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


def report_fidelity(fid: dict[str, Any]) -> None:
    b = fid["base"]
    print(f"\n## Fidelity against full prefill (docfaq, {fid['n']} questions, greedy, 64 tokens)\n")
    print("| recompute | stored | identical | first-token KL mean | KL p90 | F1 reuse | "
          "F1 full | F1 delta (SE) | computed tokens | TTFT reuse ms | TTFT full ms |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|---|")

    def fid_row(label: str, stored: str, r: dict[str, Any]) -> None:
        print(f"| {label} | {stored} | {r['same']:.3f} | {r['kl_mean']:.4f} | {r['kl_p90']:.4f} | "
              f"{r['f1_reuse']:.3f} | {r['f1_full']:.3f} | "
              f"{r['f1_delta']:+.3f} ({r['f1_delta_se']:.3f}) | "
              f"{r['computed']:.0f} of "
              f"{r['prompt']:.0f} | {r['ttft_reuse']:.0f} | {r['ttft_full']:.0f} |")  # fmt: skip

    fid_row(f"{fid['label']} (all questions)", "default", b)
    delta, se = b["f1_delta"], b["f1_delta_se"]
    print(
        f"\nF1 reuse - full: {delta:+.4f}, paired standard error {se:.4f} "
        f"(95% interval {delta - 1.96 * se:+.4f} to {delta + 1.96 * se:+.4f})"
    )
    if not fid["sweep"]:
        return
    print(f"\nSweep on the first {fid['sweep_n']} questions:\n")
    print("| recompute | stored | identical | first-token KL mean | KL p90 | F1 reuse | "
          "F1 full | F1 delta (SE) | computed tokens | TTFT reuse ms | TTFT full ms |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in fid["sweep"]:
        fid_row(r["label"], r["stored"], r)


def slots(services: Any, n_questions: int) -> dict[str, list[float]]:
    """Where reuse's error comes from: the first-token KL (full || reuse) when only the
    passage in one slot comes from the cache (stored alone beforehand; the others computed
    in place, exactly), when all of them do, and when all but the last do. Default recompute
    settings. Keyed by the case's label, in the order measured."""
    from rag.answer import prompt as prompts

    engine = services.engine
    capture = Capture(engine.runner.sampler)
    engine.runner.sampler = capture
    faq = DocFaq()
    out: dict[str, list[float]] = {}

    def build(item: Any, passages: Any, salt: str, mode: str) -> Any:
        return prompts.build(item.question, passages, context_tokens=engine.context_tokens,
                             max_tokens=64, count=engine.count_tokens, salt=salt,
                             kv_reuse=mode)  # fmt: skip

    async def main() -> None:
        for i, item in enumerate(faq.qa[:n_questions]):
            passages = faq.retrieve(services.embedder, item.question, k=5)
            exact = build(item, passages, "slots", "off")
            await generate(engine, exact.prompt, f"full-{i}", 1, f"slots-full-{i}")
            full = capture.first.pop(f"full-{i}")
            given = passages[: exact.given]
            cases = [(f"slot {n + 1} only", [p]) for n, p in enumerate(given)]
            cases += [("all of them", given), ("all but the last (computed in place)", given[:-1])]
            for n, (label, cached) in enumerate(cases):
                tag = f"slots-{i}-{n}"  # a salt of its own: nothing shared between runs
                for one in cached:
                    alone = prompts.segmented("", [one], salt=tag, kv_reuse="blend")
                    await generate(engine, alone, f"{tag}-{one.chunk_id}", 1, tag)
                    capture.first.pop(f"{tag}-{one.chunk_id}", None)
                await generate(engine, build(item, passages, tag, "blend").prompt, tag, 1, tag)
                out.setdefault(label, []).append(first_token_kl(full, capture.first.pop(tag)))

    try:
        asyncio.run(main())
    finally:
        engine.runner.sampler = capture.inner
    return out


@contextlib.contextmanager
def lingering_team() -> Iterator[None]:
    """Another thread of the process holding a torch team of its own while the engine steps,
    as the model loading on the main thread and the ingest worker's batches left one before
    rag.torch_threads (the thread waits, its team's worker asleep)."""
    import torch

    release = threading.Event()

    def hold() -> None:
        torch.ones(1 << 22).add_(1)  # a parallel kernel: the thread makes its team
        release.wait()

    holder = threading.Thread(target=hold, daemon=True)
    holder.start()
    try:
        yield
    finally:
        release.set()
        holder.join()


def contention(services: Any, n_questions: int) -> dict[str, tuple[list[float], list[float]]]:
    """A fully cached blend prompt's first token (in process, ms) and the decode rate of its
    answer (tokens/s after the first, greedy, up to 64 tokens), its question embedded just
    before as retrieval does: as the service runs now, with the query encoder's workers left
    spinning (ONNX Runtime's default), and with another thread's lasting torch team beside the
    engine's. The cases alternate per question; each ask has its own salt, so that nothing but
    its passages is cached."""
    from rag.answer import prompt as prompts

    engine = services.engine
    embedder = services.embedder
    threads = services.settings.embed.query_threads
    asleep = embedder.query_encoder(embedder.query_format, threads)
    spinning = embedder.query_encoder(embedder.query_format, threads, spinning=True)
    faq = DocFaq()
    cases = ("none", "spinning query encoder", "lingering torch team")
    out: dict[str, tuple[list[float], list[float]]] = {c: ([], []) for c in cases}

    async def main() -> None:
        for i, item in enumerate(faq.qa[:n_questions]):
            passages = faq.retrieve(embedder, item.question, k=5)
            for case in cases[i % 3 :] + cases[: i % 3]:
                tag = f"contention-{i}-{case}"
                built = prompts.build(item.question, passages, max_tokens=64, salt=tag,
                                      context_tokens=engine.context_tokens,
                                      count=engine.count_tokens)  # fmt: skip
                for one in passages[: built.given]:
                    alone = prompts.segmented("", [one], salt=tag, kv_reuse="blend")
                    await generate(engine, alone, f"{tag}-{one.chunk_id}", 1, tag)
                encoder = spinning if case == "spinning query encoder" else asleep
                team = lingering_team() if case == "lingering torch team" else None
                with team or contextlib.nullcontext():
                    encoder([item.question])
                    run = await generate(engine, built.prompt, tag, 64, tag)
                out[case][0].append(run.ttft_ms)
                if len(run.tokens) > 1:
                    rate = (len(run.tokens) - 1) / (run.total_ms - run.ttft_ms) * 1000
                    out[case][1].append(rate)

    asyncio.run(main())
    return out


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


@contextlib.contextmanager
def in_process() -> Iterator[Any]:
    """The service's components in this process, over a throwaway data directory."""
    from rag.services import build_services

    with tempfile.TemporaryDirectory() as tmp:
        settings = Settings(data_dir=Path(tmp), auth={"admin_key": "bench-admin-key-0123456789"})
        services = build_services(settings, announce_admin_key=False)
        try:
            yield services
        finally:
            services.close()


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
