"""Passage KV reuse measured in process (bench/ttft.py's part 3 and its `--slots` and
`--contention` modes): the engine and the service's prompt builder, no HTTP.

- fidelity: each docfaq question answered greedily with full prefill and with its passages'
  KV taken from the cache (each passage computed beforehand in a prompt of its own, or, with
  TTFT_WARM=context, by an earlier prompt over the same passages in another order): identical
  answers, the first token's KL divergence (full || reuse), answer token F1; then the
  recompute policy and storage format swept (TTFT_SWEEP picks the rows);
- slots: the first-token KL when only the passage in one slot comes from the cache;
- contention: a fully cached prompt's first token and decode rate beside a spinning query
  encoder or another thread's lasting torch team.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import math
import os
import statistics
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from _docfaq import DocFaq, token_f1
from _stats import pct

from rag.config import Settings


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
        planner = engine.scheduler.reuse
        cfg = planner.config
        default_first = cfg.recompute_first
        # (how, amount, stored): "first" recomputes each passage's first `amount` tokens,
        # "deviation" the share `amount` whose values deviate most after the first layer.
        choices = sweep_choices(default_first) if sweep_n else []
        for how, amount, stored in choices:
            # "last": the default recompute, and the last `amount` passages computed whole.
            planner.config = dataclasses.replace(
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
                planner.config)  # fmt: skip
            summary.update(label=label, stored=stored or str(old_dtype).removeprefix("torch."))
            sweep.append(summary)
            print(f"  sweep {label} ({summary['stored']}): identical {summary['same']:.3f}, "
                  f"KL {summary['kl_mean']:.4f}", flush=True)  # fmt: skip
        planner.config = cfg
        engine.passages.clear()
        return {"base": base, "sweep": sweep, "n": len(qa), "sweep_n": sweep_n,
                "label": recompute_label(cfg)}  # fmt: skip

    try:
        return asyncio.run(main())
    finally:
        engine.runner.sampler = capture.inner


def recompute_label(cfg: Any) -> str:
    """What a reuse config recomputes of reused passages, as the tables name it."""
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
