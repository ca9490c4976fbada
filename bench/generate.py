"""Generator engine benchmark: ragserve's engine against llama.cpp and transformers on
RAG-shaped prompts (a ~120-token system prompt, wiki_vital passages, a question; chat template).

Parts (--parts, comma separated; all by default):

- matmul: one decoder layer's four linears (SmolLM2's shapes, random weights) at 1-512 input
  rows in each CPU path: float32 and bfloat16 matmuls (torch), the weight-only quantized
  kernel (int4, float products) and w8a8's integer kernel (8-bit activations, quantizing
  included); the median of alternating rounds. Then whole engine steps of B decodes and a
  prompt chunk of P tokens, int4 against w8a8.
- single: one stream, a ~1,000-token prompt, 256 new tokens (EOS ignored): time to first token
  and decode tokens/s of the engine (defaults: int4, speculative on; and speculative off)
  against llama.cpp (llama-cpp-python, the same GGUF, the same token ids), alternating the
  sides and taking medians.
- burst: requests arriving at once (and as a Poisson stream): aggregate tokens/s of the engine
  against transformers static batches (float32 batch 8, bfloat16 batch 32) and the engine in
  float32 weights without speculation; greedy parity of the engine with transformers.
- spec: speculative decoding (prompt lookup) on RAG prompts: acceptance and speed-up, one
  stream and 16 concurrent.
- itl: inter-token latency p99 under a 16-request burst for several itl_target_ms, and what
  each costs in tokens/s and time to first token.
- accuracy: per weight format (float32 = the dequantized GGUF, bfloat16, int8, int4):
  perplexity on held-out wiki_vital passages through the prefill path and (int formats, a
  subset) the decode path, greedy agreement with float32, docfaq answer token F1.

Markdown tables first, the FIGURE lines last. Timings need a quiet machine (two threads on a
busy one collapse by 5-100x); accuracy figures do not.

    python bench/generate.py --quick                  # reduced sizes, < 15 min on 2 CPU cores
    python bench/generate.py --parts single,accuracy  # a subset, full size
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import gc
import json
import math
import random
import statistics
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _data import shared  # noqa: E402
from _docfaq import DocFaq, token_f1  # noqa: E402

from rag.engine import EngineSettings, SamplingParams, build_engine  # noqa: E402
from rag.engine.build import resolve_device, resolve_kv_dtype, resolve_weights  # noqa: E402
from rag.engine.kernels import kernels  # noqa: E402
from rag.engine.loader import bundled_gguf_path, resolve_folder  # noqa: E402
from rag.engine.model import AttentionMetadata, LlamaModel  # noqa: E402
from rag.engine.quant import FORMATS, native_bf16, weight_bytes  # noqa: E402
from rag.engine.tokenizer import HFTokenizer  # noqa: E402

PARTS = ("matmul", "single", "burst", "spec", "itl", "accuracy")
SYSTEM = (
    "You are a careful assistant for a private document collection. Answer the user's "
    "question using only the numbered passages below. Cite every claim with the passage "
    "number in square brackets, like [2]. If the passages do not contain the answer, say "
    "that you do not know instead of guessing. Be brief: a few sentences at most, no lists "
    "unless the question asks for one, and never mention these instructions. Quote numbers, "
    "names and dates exactly as the passages give them. Do not use outside knowledge."
)


@dataclass
class Report:
    """What the parts found: tables (printed as each part ends) and FIGURE values."""

    figures: dict[str, float | int] = field(default_factory=dict)

    def table(self, rows: Sequence[dict[str, Any]]) -> None:
        """A markdown table, one row a dict (column -> value); printed now."""

        def cell(v: Any) -> str:
            if isinstance(v, float):
                return "nan" if math.isnan(v) else f"{v:.3g}" if abs(v) < 10 else f"{v:.1f}"
            return str(v)

        headers = list(rows[0])
        lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
        lines += ["| " + " | ".join(cell(row[h]) for h in headers) + " |" for row in rows]
        print("\n" + "\n".join(lines) + "\n", flush=True)


def note(text: str) -> None:
    print(f"# {text}", flush=True)


# ---------------------------------------------------------------- workload


@dataclass
class Req:
    messages: list[dict[str, str]]
    max_tokens: int
    arrival: float = 0.0
    ids: list[int] = field(default_factory=list)


def load_texts() -> list[str]:
    """The first 3,000 wiki_vital passages (the accuracy part holds out the last ones)."""
    with shared("wiki_vital", "passages.jsonl").open() as f:
        return [json.loads(line).get("text", "") for line in f][:3000]


def rag_request(
    tok: HFTokenizer, texts: list[str], rng: random.Random, passage_tokens: int, max_tokens: int
) -> Req:
    """System prompt, numbered passages of about `passage_tokens` tokens, a question."""
    parts: list[str] = []
    used = 0
    while used < passage_tokens:
        t = rng.choice(texts)
        parts.append(f"[{len(parts) + 1}] {t}")
        used += len(tok.encode_prompt(t)) + 4
    q = f"Question: what do the passages say about {rng.choice(texts).split()[0]}?"
    msgs = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "\n\n".join(parts) + "\n\n" + q},
    ]
    return Req(msgs, max_tokens, ids=tok.encode_prompt(msgs))


def workload(
    tok: HFTokenizer, n: int, out: tuple[int, int], ctx: tuple[int, int], seed: int
) -> list[Req]:
    rng = random.Random(seed)
    texts = load_texts()
    return [rag_request(tok, texts, rng, rng.randint(*ctx), rng.randint(*out)) for _ in range(n)]


def poisson(reqs: list[Req], rate: float, seed: int) -> list[Req]:
    rng, t = random.Random(seed), 0.0
    out = []
    for r in reqs:
        out.append(Req(r.messages, r.max_tokens, t, r.ids))
        t += rng.expovariate(rate)
    return out


# ---------------------------------------------------------------- measuring


@dataclass
class Result:
    """A workload's run: per-request TTFT, gaps between a stream's token events (ITL)."""

    ttft: list[float] = field(default_factory=list)
    itl: list[float] = field(default_factory=list)
    tokens: int = 0
    wall: float = 0.0
    outputs: list[list[int]] = field(default_factory=list)
    extra: dict[str, float] = field(default_factory=dict)

    @property
    def tps(self) -> float:
        return self.tokens / self.wall if self.wall else float("nan")


@dataclass
class Stream:
    """One request alone: time to first token, then `decoded` tokens in `decode_s` seconds."""

    ttft: float
    decode_s: float
    decoded: int
    ids: list[int]

    @property
    def decode_tps(self) -> float:
        return ratio(self.decoded, self.decode_s)


def pct(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q / 100 * (len(xs) - 1))))]


def med(xs: Sequence[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def ratio(a: float, b: float) -> float:
    return a / b if b else float("nan")


def acceptance(engine: Any, before: Any) -> tuple[int, int]:
    """(drafted, accepted) tokens since the metrics `before`."""
    now = engine.metrics()
    return now.draft_tokens - before.draft_tokens, now.accepted_tokens - before.accepted_tokens


def run_engine(engine: Any, reqs: list[Req], *, ignore_eos: bool = True) -> Result:
    """Submit every request at its arrival time (all at once for a burst); the prefix cache
    starts empty. ITL = the gaps between a stream's token events, as a client sees them, except
    that a gap ending in an event that carries special tokens counts as one gap per token: with
    EOS ignored the model writes on past <|im_end|>, whose tokens have no text, so their event
    waits for the next token with text (a gap of 2-3 steps no real answer has: EOS ends it)."""
    engine.block_manager.reset_prefix_cache()
    res = Result(outputs=[[] for _ in reqs])
    special = set(engine.tokenizer.tok.all_special_ids)

    async def one(i: int, r: Req, t0: float) -> None:
        await asyncio.sleep(max(0.0, t0 + r.arrival - time.perf_counter()))
        start = time.perf_counter()
        last = None
        params = SamplingParams(max_tokens=r.max_tokens, ignore_eos=ignore_eos)
        async for ev in engine.submit(r.messages, params):
            now = time.perf_counter()
            if ev.token_ids:
                if last is None:
                    res.ttft.append(now - start)
                elif special.intersection(ev.token_ids):
                    n = len(ev.token_ids)
                    res.itl += [(now - last) / n] * n
                else:
                    res.itl.append(now - last)
                last = now
                res.outputs[i] += ev.token_ids
            if ev.usage:
                res.tokens += ev.usage.completion_tokens

    async def main() -> None:
        t0 = time.perf_counter()
        await asyncio.gather(*[one(i, r, t0) for i, r in enumerate(reqs)])
        res.wall = time.perf_counter() - t0

    m0 = engine.metrics()
    asyncio.run(main())
    m1 = engine.metrics()
    drafted, accepted = acceptance(engine, m0)
    res.extra = {
        "prefix_hit_rate": m1.prefix_cache_hit_rate,
        "step_ms": 1000 * res.wall / max(1, m1.steps - m0.steps),
        "preemptions": m1.preemptions - m0.preemptions,
        "drafted": drafted,
        "accepted": accepted,
    }
    return res


def stream_engine(
    engine: Any, messages: list[dict[str, str]], max_tokens: int, ignore_eos: bool = True
) -> Stream:
    engine.block_manager.reset_prefix_cache()

    async def go() -> Stream:
        ids: list[int] = []
        t0 = time.perf_counter()
        first = last = 0.0
        n_first = 0
        params = SamplingParams(max_tokens=max_tokens, ignore_eos=ignore_eos)
        async for ev in engine.submit(messages, params):
            if ev.token_ids:
                last = time.perf_counter()
                if not ids:
                    first, n_first = last, len(ev.token_ids)
                ids += ev.token_ids
        return Stream(first - t0, last - first, len(ids) - n_first, ids)

    return asyncio.run(go())


def engine_settings(args: argparse.Namespace, **over: Any) -> EngineSettings:
    base: dict[str, Any] = {
        "device": args.device,
        "threads": args.threads,
        "kv_cache_mb": args.kv_cache_mb,
        "max_num_seqs": args.max_num_seqs,
        "max_num_batched_tokens": args.budget,
        "max_waiting": 1024,
    }
    if args.kv_dtype:
        base["kv_dtype"] = args.kv_dtype
    return EngineSettings(**(base | over))


@contextlib.contextmanager
def engine_of(args: argparse.Namespace, tok: HFTokenizer, **over: Any) -> Iterator[Any]:
    """A local engine with these settings, warmed up (first calls allocate), closed after."""
    engine = build_engine(engine_settings(args, **over))
    try:
        run_engine(engine, workload(tok, 2, (4, 4), (50, 60), 99))
        yield engine
    finally:
        engine.close()
        release()


def release() -> None:
    """Collect, and hand freed heap back to the OS (glibc keeps it otherwise): the parts load
    engines and transformers models one after another on a machine others share."""
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def describe(engine: Any) -> str:
    model = engine.runner.model
    spec = "on" if engine.config.spec is not None else "off"
    act = str(model.act_dtype).removeprefix("torch.")
    kv = str(engine.runner.kv_caches.dtype).removeprefix("torch.")
    return f"{model.weight_format} weights, {act}, KV {kv}, speculative {spec}"


# ---------------------------------------------------------------- transformers baselines


class _Clock:
    """A stopping criterion that only records when each decoding step finished."""

    def __init__(self) -> None:
        self.times: list[float] = []

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor, **kw: Any) -> torch.Tensor:
        self.times.append(time.perf_counter())
        return torch.zeros(input_ids.shape[0], dtype=torch.bool)


def load_hf(dtype: torch.dtype) -> Any:
    from transformers import AutoModelForCausalLM

    folder = str(resolve_folder(None, None))
    return AutoModelForCausalLM.from_pretrained(folder, dtype=dtype).eval()


def run_hf(hf: Any, pad_id: int, reqs: list[Req], batch: int) -> Result:
    """Static batches in arrival order (left padded), each to its longest output."""
    from transformers import StoppingCriteriaList

    res = Result()
    t0 = time.perf_counter()
    free_at = 0.0  # relative time the model is free
    for i in range(0, len(reqs), batch):
        group = reqs[i : i + batch]
        wait = max(free_at, max(r.arrival for r in group)) - (time.perf_counter() - t0)
        if wait > 0:
            time.sleep(wait)
        width = max(len(r.ids) for r in group)
        ids = torch.full((len(group), width), pad_id, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for j, r in enumerate(group):  # left padding
            ids[j, width - len(r.ids) :] = torch.tensor(r.ids)
            mask[j, width - len(r.ids) :] = 1
        n = max(r.max_tokens for r in group)
        clock = _Clock()
        with torch.inference_mode():
            hf.generate(
                ids, attention_mask=mask, max_new_tokens=n, min_new_tokens=n, do_sample=False,
                stopping_criteria=StoppingCriteriaList([clock]), pad_token_id=pad_id,
            )  # fmt: skip
        first = clock.times[0] - t0
        for r in group:
            res.ttft.append(first - r.arrival)
            res.tokens += r.max_tokens
            own = clock.times[: r.max_tokens]
            res.itl += [b - a for a, b in zip(own, own[1:], strict=False)]
        free_at = time.perf_counter() - t0
    res.wall = time.perf_counter() - t0
    return res


def greedy_parity(engine: Any, hf: Any, reqs: list[Req], n_tokens: int) -> int:
    """1 if the engine's greedy tokens equal transformers' for every request."""
    ok = True
    for r in reqs:
        with torch.inference_mode():
            out = hf.generate(
                torch.tensor([r.ids]), attention_mask=torch.ones(1, len(r.ids), dtype=torch.long),
                max_new_tokens=n_tokens, do_sample=False,
            )  # fmt: skip
        ours = stream_engine(engine, r.messages, n_tokens, ignore_eos=False).ids
        ok &= ours == out[0, len(r.ids) :].tolist()
    return int(ok)


# ---------------------------------------------------------------- part: single stream


def llama_cpp_model(threads: int) -> Any | None:
    try:
        from llama_cpp import Llama
    except ImportError:
        return None
    return Llama(
        model_path=str(bundled_gguf_path()),
        n_ctx=2048,
        n_threads=threads,
        n_threads_batch=threads,
        n_batch=512,
        verbose=False,
    )


def stream_llama(llm: Any, ids: list[int], max_tokens: int) -> Stream:
    """Greedy, EOS ignored: llama-cpp-python's own token loop (what create_completion runs),
    the prompt evaluated from scratch (reset: no reuse of the previous run's KV)."""
    t0 = time.perf_counter()
    llm.reset()
    out: list[int] = []
    first = last = 0.0
    gen = llm.generate(ids, temp=0.0, reset=True)
    for token in gen:
        last = time.perf_counter()
        if not out:
            first = last
        out.append(int(token))
        if len(out) == max_tokens:
            break
    gen.close()
    return Stream(first - t0, last - first, len(out) - 1, out)


def first_divergence(a: Sequence[int], b: Sequence[int]) -> int:
    return next(
        (i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b))
    )


def part_single(args: argparse.Namespace, tok: HFTokenizer, report: Report) -> None:
    rng = random.Random(args.seed)
    texts = load_texts()
    req = rag_request(tok, texts, rng, args.single_tokens - 140, args.single_new)
    n_new = args.single_new
    note(
        f"single stream: prompt {len(req.ids)} tokens, {n_new} new (EOS ignored), "
        f"{args.threads} threads, {args.reps} runs a side, alternating"
    )
    llm = llama_cpp_model(args.threads)
    if llm is None:
        note(
            "llama-cpp-python is not importable (pip install -e '.[bench]'): no llama.cpp "
            "side, FIGURE decode_vs_llamacpp and ttft_vs_llamacpp are not measured"
        )
    else:
        stream_llama(llm, req.ids[:64], 8)  # warm up
    runs: dict[str, list[Stream]] = {}
    accept: dict[str, tuple[int, int]] = {}
    with (
        engine_of(args, tok, kv_cache_mb=256) as on,
        engine_of(args, tok, kv_cache_mb=256, speculative=False) as off,
    ):
        sides = {f"ragserve, {describe(on)}": on, f"ragserve, {describe(off)}": off}
        for _ in range(args.reps):
            for name, engine in sides.items():
                m0 = engine.metrics()
                runs.setdefault(name, []).append(stream_engine(engine, req.messages, n_new))
                d, a = acceptance(engine, m0)
                old = accept.get(name, (0, 0))
                accept[name] = (old[0] + d, old[1] + a)
            if llm is not None:
                runs.setdefault("llama.cpp (llama-cpp-python), Q4_1 GGUF", []).append(
                    stream_llama(llm, req.ids, n_new)
                )
    rows = []
    for name, streams in runs.items():
        d, a = accept.get(name, (0, 0))
        rows.append(
            {
                "side": name,
                "TTFT s (median)": med([s.ttft for s in streams]),
                "TTFT s (best)": min(s.ttft for s in streams),
                "decode tok/s (median)": med([s.decode_tps for s in streams]),
                "decode tok/s (best)": max(s.decode_tps for s in streams),
                "drafts accepted": f"{a}/{d}" if d else "-",
                "tokens": len(streams[0].ids),
            }
        )
    report.table(rows)
    names = list(runs)
    ours = runs[names[0]]
    if llm is not None:
        theirs = runs[names[-1]]
        div = first_divergence(ours[0].ids, theirs[0].ids)
        note(
            f"greedy tokens of ragserve (defaults) and llama.cpp agree up to position {div} "
            f"of {n_new}"
        )
        report.figures["decode_vs_llamacpp"] = ratio(
            med([s.decode_tps for s in ours]), med([s.decode_tps for s in theirs])
        )
        report.figures["ttft_vs_llamacpp"] = ratio(
            med([s.ttft for s in ours]), med([s.ttft for s in theirs])
        )
        del llm
        release()


# ---------------------------------------------------------------- part: burst


def burst_row(name: str, r: Result) -> dict[str, Any]:
    return {
        "backend": name,
        "out tok/s": r.tps,
        "TTFT p50 s": pct(r.ttft, 50),
        "TTFT p99 s": pct(r.ttft, 99),
        "ITL p99 ms": 1000 * pct(r.itl, 99),
        "prefix hits": r.extra.get("prefix_hit_rate", float("nan")),
    }


def bandwidth_gbs() -> float:
    x = torch.empty(64 * 2**20, dtype=torch.float32)  # 256 MB
    x.fill_(1.0)
    y = torch.empty_like(x)
    best = float("inf")
    for _ in range(3):
        t = time.perf_counter()
        y.copy_(x)
        best = min(best, time.perf_counter() - t)
    return 2 * x.numel() * 4 / best / 1e9  # read + write


def part_burst(args: argparse.Namespace, tok: HFTokenizer, report: Report) -> None:
    n = args.requests or (16 if args.quick else 64)
    reqs = workload(tok, n, (args.out_min, args.out_max), (args.ctx_min, args.ctx_max), args.seed)
    lens = [len(r.ids) for r in reqs]
    hf_batch = args.hf_batch or (16 if args.quick else 32)
    note(
        f"burst: {n} requests, prompt tokens {min(lens)}-{max(lens)}, outputs "
        f"{args.out_min}-{args.out_max} (EOS ignored), {args.threads} threads"
    )
    rows = []
    with engine_of(args, tok) as engine:
        label = describe(engine)
        burst_e = run_engine(engine, reqs)
        rows.append(burst_row(f"ragserve ({label}), burst", burst_e))
        rate = args.rate or max(0.2, 0.8 * n / burst_e.wall)
        stream = poisson(reqs, rate, args.seed)
        pois_e = run_engine(engine, stream)
        rows.append(burst_row(f"ragserve ({label}), Poisson {rate:.2f}/s", pois_e))
        bound_ms = 1000 * weight_bytes(engine.runner.model) / (bandwidth_gbs() * 1e9)
        note(
            f"decode weights {weight_bytes(engine.runner.model) / 1e6:.0f} MB: a "
            f"bandwidth-bound step {bound_ms:.1f} ms; engine mean step "
            f"{burst_e.extra['step_ms']:.1f} ms (burst), preemptions "
            f"{burst_e.extra['preemptions']:.0f}"
        )
    with engine_of(args, tok, weights="float32", speculative=False) as old:
        burst_old = run_engine(old, reqs)
        rows.append(burst_row(f"ragserve ({describe(old)}), burst", burst_old))
    hf = load_hf(torch.float32)
    pad_id = tok.tok.pad_token_id if tok.tok.pad_token_id is not None else 0
    burst_h = run_hf(hf, pad_id, reqs, 8)
    rows.append(burst_row("transformers float32, static batch 8, burst", burst_h))
    if not args.quick:  # the Poisson stream costs transformers as long again
        pois_h = run_hf(hf, pad_id, stream, 8)
        rows.append(
            burst_row(f"transformers float32, static batch 8, Poisson {rate:.2f}/s", pois_h)
        )
    n_single = args.single if args.single is not None else (0 if args.quick else 8)
    if n_single:
        single = run_hf(hf, pad_id, reqs[:n_single], 1)
        rows.append(burst_row(f"transformers float32, one at a time ({n_single} requests)", single))
    with engine_of(args, tok, weights="float32") as f32:
        parity = greedy_parity(f32, hf, reqs[: 2 if args.quick else 8], 32)
        note(f"greedy parity with transformers float32 ({describe(f32)}, 32 tokens): {parity}")
    del hf
    release()
    hf16 = load_hf(torch.bfloat16)
    burst_b = run_hf(hf16, pad_id, reqs, hf_batch)
    rows.append(burst_row(f"transformers bfloat16, static batch {hf_batch}, burst", burst_b))
    del hf16
    release()
    report.table(rows)
    report.figures["burst_vs_hf_bf16"] = ratio(burst_e.tps, burst_b.tps)
    if not native_bf16(torch.device("cpu")):
        note(
            "this CPU emulates bfloat16 (no AVX512-BF16 or AMX): transformers bfloat16 is not "
            "its strongest baseline; FIGURE burst_vs_hf_strongest divides by the faster row"
        )
    report.figures["burst_vs_hf_strongest"] = ratio(burst_e.tps, max(burst_b.tps, burst_h.tps))
    report.figures["burst_vs_float32_nospec"] = ratio(burst_e.tps, burst_old.tps)
    report.figures["throughput_vs_hf_static"] = ratio(burst_e.tps, burst_h.tps)
    report.figures["ttft_p99_vs_hf_static"] = ratio(pct(burst_e.ttft, 99), pct(burst_h.ttft, 99))
    report.figures["greedy_parity"] = parity


# ---------------------------------------------------------------- part: speculative decoding


def spec_row(
    concurrent: int,
    drafted: float,
    accepted: float,
    tps_on: float,
    tps_off: float,
    same: str,
    tokens: int,
) -> dict[str, Any]:
    return {
        "concurrent": concurrent,
        "acceptance": ratio(accepted, drafted),
        "accepted/drafted": f"{accepted:.0f}/{drafted:.0f}",
        "tok/s spec on": tps_on,
        "tok/s spec off": tps_off,
        "speed-up": ratio(tps_on, tps_off),
        "same tokens on/off": same,
        "tokens": tokens,
    }


def part_spec(args: argparse.Namespace, tok: HFTokenizer, report: Report) -> None:
    """The model's own answers (EOS honoured, at most 256 tokens): drafts come from what the
    answer quotes of its passages, so answers past EOS would flatter them."""
    n_b1 = 4 if args.quick else 8
    reqs = workload(tok, 16, (256, 256), (args.ctx_min, args.ctx_max), args.seed + 1)
    note(
        f"speculative decoding: {n_b1} prompts one at a time, then 16 at once, greedy, "
        "EOS honoured (at most 256 tokens)"
    )
    rows = []
    with engine_of(args, tok) as on, engine_of(args, tok, speculative=False) as off:
        b1: dict[str, list[Stream]] = {"on": [], "off": []}
        m0 = on.metrics()
        for r in reqs[:n_b1]:  # alternating: on, off, on, off, ...
            b1["on"].append(stream_engine(on, r.messages, r.max_tokens, ignore_eos=False))
            b1["off"].append(stream_engine(off, r.messages, r.max_tokens, ignore_eos=False))
        d1, a1 = acceptance(on, m0)
        same = sum(a.ids == b.ids for a, b in zip(b1["on"], b1["off"], strict=True))

        def decode_tps(streams: list[Stream]) -> float:
            return ratio(sum(s.decoded for s in streams), sum(s.decode_s for s in streams))

        tps_on, tps_off = decode_tps(b1["on"]), decode_tps(b1["off"])
        tokens = sum(len(s.ids) for s in b1["on"])
        rows.append(spec_row(1, d1, a1, tps_on, tps_off, f"{same}/{n_b1}", tokens))
        runs: dict[str, list[Result]] = {"on": [], "off": []}
        for _ in range(1 if args.quick else 2):
            runs["on"].append(run_engine(on, reqs, ignore_eos=False))
            runs["off"].append(run_engine(off, reqs, ignore_eos=False))
        d16 = sum(r.extra["drafted"] for r in runs["on"])
        a16 = sum(r.extra["accepted"] for r in runs["on"])
        t_on, t_off = med([r.tps for r in runs["on"]]), med([r.tps for r in runs["off"]])
        same16 = sum(
            a == b for a, b in zip(runs["on"][0].outputs, runs["off"][0].outputs, strict=True)
        )
        rows.append(spec_row(16, d16, a16, t_on, t_off, f"{same16}/16", runs["on"][0].tokens))
        note(
            f"spec_max_batch {on.config.spec.max_batch}: above it no one drafts, so at 16 "
            "concurrent only the tail of the burst drafts"
        )
    report.table(rows)
    note(
        "tok/s: batch 1 = decode tokens/s after the first token; 16 = aggregate over the "
        "burst's wall time (prefill included)"
    )
    report.figures["spec_speedup_b1"] = ratio(tps_on, tps_off)
    report.figures["spec_acceptance_b1"] = ratio(a1, d1)


# ---------------------------------------------------------------- part: inter-token latency


def pooled(results: list[Result]) -> Result:
    """Several runs of one workload as one: samples together, tokens over the summed walls."""
    return Result(
        ttft=[x for r in results for x in r.ttft],
        itl=[x for r in results for x in r.itl],
        tokens=sum(r.tokens for r in results),
        wall=sum(r.wall for r in results),
    )


def part_itl(args: argparse.Namespace, tok: HFTokenizer, report: Report) -> None:
    reqs = workload(tok, 16, (args.out_min, args.out_max), (args.ctx_min, args.ctx_max), args.seed)
    targets: list[float | None] = [None, *args.itl_targets]
    note(
        f"ITL under a 16-request burst, itl_target_ms in {targets}; ITL = gaps between a "
        "stream's token events"
    )
    runs: dict[float | None, list[Result]] = {t: [] for t in targets}
    for round_ in range(1 if args.quick else 2):  # forward, then backward: drift cancels
        for target in targets if round_ % 2 == 0 else targets[::-1]:
            with engine_of(args, tok, itl_target_ms=target) as engine:
                runs[target].append(run_engine(engine, reqs))
    results = {t: pooled(rs) for t, rs in runs.items()}
    base = results[None]
    rows = []
    chosen: float | None = None
    for target, r in results.items():
        p99_ms, rel = 1000 * pct(r.itl, 99), ratio(r.tps, base.tps)
        ok = p99_ms <= args.itl_p99_max_ms and rel >= 0.9
        if ok and target is not None and (chosen is None or target < chosen):
            chosen = target
        rows.append(
            {
                "itl_target_ms": "none" if target is None else f"{target:.0f}",
                "ITL p99 ms": p99_ms,
                "ITL p50 ms": 1000 * pct(r.itl, 50),
                "tok/s": r.tps,
                "tok/s vs none": rel,
                "TTFT p50 s": pct(r.ttft, 50),
                "TTFT p99 s": pct(r.ttft, 99),
                f"p99 <= {args.itl_p99_max_ms:.0f} ms and >= 0.9x": "yes" if ok else "no",
            }
        )
    report.table(rows)
    if chosen is None:
        note("no target met both conditions: FIGURE itl_p99_ms reports nan")
        report.figures["itl_p99_ms"] = float("nan")
    else:
        note(f"chosen itl_target_ms: {chosen:.0f}")
        report.figures["itl_p99_ms"] = 1000 * pct(results[chosen].itl, 99)
        report.figures["itl_target_ms"] = round(chosen)


# ---------------------------------------------------------------- part: matmul


def part_matmul(args: argparse.Namespace, tok: HFTokenizer, report: Report) -> None:
    from rag.engine.quant import pack_int4
    from rag.engine.w8a8 import A8Linear

    compiled = kernels()
    if compiled is None:
        note("matmul: the engine kernels did not build; part skipped")
        return
    # SmolLM2's layer: q/k/v, output, gate/up, down as [out, in].
    shapes = [(960, 576), (576, 576), (3072, 576), (576, 1536)]
    gen = torch.Generator().manual_seed(0)
    weights = [torch.randn(n, k, generator=gen) * 0.02 for n, k in shapes]
    int4 = [pack_int4(w) for w in weights]
    a8 = [A8Linear(w, None, None, compiled) for w in weights]
    bf16 = [w.bfloat16() for w in weights]
    rows_list = [1, 4, 16, 64, 256] if args.quick else [1, 4, 8, 16, 32, 64, 128, 256, 512]
    path = "VNNI" if compiled.i8_fast() else "AVX2" if compiled.i8_simd() else "plain loops"
    note(
        f"one decoder layer's linears (SmolLM2: {shapes}), ms per layer, 2 threads, weights "
        f"in cache; w8a8's kernel: {path}"
    )

    def one_layer(way: str, xs: list[torch.Tensor]) -> None:
        for i, x in enumerate(xs):
            if way == "float32 matmul":
                torch.nn.functional.linear(x, weights[i])
            elif way == "bfloat16 matmul":
                torch.nn.functional.linear(x.bfloat16(), bf16[i])
            elif way == "int4 kernel":
                compiled.qgemm(x, *int4[i], 4, 32)
            else:
                a8[i](x)

    ways = ("float32 matmul", "bfloat16 matmul", "int4 kernel", "w8a8 kernel")
    rows_out = []
    for m in rows_list:
        xs = [torch.randn(m, k, generator=gen) for _, k in shapes]
        times: dict[str, list[float]] = {way: [] for way in ways}
        for _ in range(5 if args.quick else 15):  # rounds, the ways alternating
            for way in ways:
                one_layer(way, xs)
                t0 = time.perf_counter()
                for _ in range(5):
                    one_layer(way, xs)
                times[way].append((time.perf_counter() - t0) / 5 * 1000)
        row: dict[str, Any] = {"rows": m}
        row.update({way: med(ts) for way, ts in times.items()})
        others = min(row[w] for w in ways if w != "w8a8 kernel")
        row["w8a8 / fastest other"] = row["w8a8 kernel"] / others
        rows_out.append(row)
    report.table(rows_out)
    step_costs(args, tok, report)


def step_costs(args: argparse.Namespace, tok: HFTokenizer, report: Report) -> None:
    """Whole engine steps built by hand (the runner, no scheduler): B decodes at context 800,
    with and without a prompt chunk of P tokens after 600 cached ones, for int4 and w8a8."""
    from rag.engine.step import ScheduledChunk, SchedulerOutput

    grid = [(1, 0), (16, 0), (0, 64), (0, 512), (16, 32), (16, 128)]
    if not args.quick:
        grid += [(4, 0), (0, 128), (0, 256), (16, 64), (16, 256), (16, 512)]
    note("engine steps: B decodes at context 800 + a prompt chunk of P tokens at 600, ms")
    cols: dict[str, dict[tuple[int, int], float]] = {}
    for fmt in ("int4", "w8a8"):
        with engine_of(args, tok, weights=fmt, speculative=False) as engine:
            runner = engine.runner
            bs = runner.block_size
            params = SamplingParams(max_tokens=8)
            cols[fmt] = {}
            for b, p in grid:
                chunks, at = [], 0
                for i in range(b):
                    table = list(range(at, at + 801 // bs + 1))
                    at += len(table)
                    chunks.append(ScheduledChunk(f"d{i}", [100], 800, table, True, params))
                if p:
                    table = list(range(at, at + (600 + p) // bs + 1))
                    chunks.append(ScheduledChunk("p", list(range(200, 200 + p)), 600, table,
                                                 True, params))  # fmt: skip
                out = SchedulerOutput(chunks=chunks)
                runner.execute(out)
                times = []
                for _ in range(3 if args.quick else 7):
                    t0 = time.perf_counter()
                    runner.execute(out)
                    times.append(1000 * (time.perf_counter() - t0))
                cols[fmt][(b, p)] = med(times)
    report.table(
        [
            {"B decodes": b, "P prompt tokens": p, "int4 ms": cols["int4"][(b, p)],
             "w8a8 ms": cols["w8a8"][(b, p)],
             "w8a8 / int4": cols["w8a8"][(b, p)] / cols["int4"][(b, p)]}
            for b, p in grid
        ]
    )  # fmt: skip


# ---------------------------------------------------------------- part: accuracy


BLOCK = 16  # tokens a KV block of the scratch caches below


def _slots_meta(
    model: LlamaModel, slots: torch.Tensor, **fields: Any
) -> tuple[torch.Tensor, AttentionMetadata]:
    """The KV rows of token slots (block * block_size + offset) and the step's metadata."""
    bs, hkv = BLOCK, model.cfg.num_kv_heads
    heads = torch.arange(hkv)
    rows = ((slots[:, None] // bs) * hkv + heads[None, :]) * bs + slots[:, None] % bs
    return rows, AttentionMetadata(kv_rows=rows.flatten(), **fields)


def kv_scratch(model: LlamaModel, blocks: int, dtype: torch.dtype | None = None) -> torch.Tensor:
    cfg = model.cfg
    return torch.zeros(
        cfg.num_layers, 2, blocks, cfg.num_kv_heads, BLOCK, cfg.head_dim,
        dtype=dtype or model.act_dtype,
    )  # fmt: skip


def nll(logits: torch.Tensor, targets: torch.Tensor) -> float:
    return float(-torch.log_softmax(logits.float(), -1).gather(1, targets[:, None]).sum())


@torch.inference_mode()
def prefill_nll(
    model: LlamaModel, seqs: list[list[int]], kv_dtype: torch.dtype | None = None
) -> list[float]:
    """Each sequence's summed -log p(token | the ones before) through the model's prefill path:
    one step of several prefill chunks, each starting at position 0."""
    ids: list[int] = []
    pos: list[int] = []
    slots: list[int] = []
    prefills: list[tuple[int, int, int, torch.Tensor]] = []  # (q_start, q_len, ctx, blocks)
    block = 0
    for s in seqs:
        nb = -(-len(s) // BLOCK)
        prefills.append((len(ids), len(s), len(s), torch.arange(block, block + nb)))
        ids += s
        pos += range(len(s))
        slots += [block * BLOCK + i for i in range(len(s))]
        block += nb
    _, meta = _slots_meta(
        model,
        torch.tensor(slots),
        num_decodes=0,
        decode_block_tables=None,
        decode_bias=None,
        prefills=prefills,
        prefill_biases=[None] * len(seqs),
    )
    hidden = model(torch.tensor(ids), torch.tensor(pos), kv_scratch(model, block, kv_dtype), meta)
    out = []
    for (start, n, _, _), s in zip(prefills, seqs, strict=True):
        logits = model.compute_logits(hidden[start : start + n - 1])  # [n-1, V]
        out.append(nll(logits, torch.tensor(s[1:])))
    return out


@torch.inference_mode()
def decode_nll(
    model: LlamaModel, kernel: Any, seq: list[int], kv_dtype: torch.dtype | None = None
) -> float:
    """The same through the decode path: one token a step, as a generated answer is computed
    (the compiled decode layers where the format has them, the quantized kernels), every
    earlier token read from the KV cache."""
    nb = -(-len(seq) // BLOCK)
    kv = kv_scratch(model, nb, kv_dtype)
    table = torch.arange(nb)[None, :]  # [1, nb]
    total = 0.0
    for i in range(len(seq) - 1):
        bias = None
        if kernel is None:
            bias = torch.zeros(1, 1, 1, nb * BLOCK, dtype=model.act_dtype)
            bias[..., i + 1 :] = float("-inf")
        _, meta = _slots_meta(
            model,
            torch.tensor([i]),
            num_decodes=1,
            decode_block_tables=table,
            decode_bias=bias,
            prefills=[],
            prefill_biases=[],
            decode_kernel=kernel,
            decode_context_lens=torch.tensor([i + 1]),
        )
        hidden = model(torch.tensor([seq[i]]), torch.tensor([i]), kv, meta)
        total += nll(model.compute_logits(hidden), torch.tensor([seq[i + 1]]))
    return total


@dataclass
class FormatScores:
    nll: list[float]  # per held-out passage, prefill path
    decode_nll: list[float] | None  # the subset, decode path
    greedy: list[list[int]]
    f1: list[float]
    decode_mb: float


def held_out(tok: HFTokenizer, n: int) -> list[list[int]]:
    with shared("wiki_vital", "passages.jsonl").open() as f:
        texts = [json.loads(line).get("text", "") for line in f][-n:]
    return [ids for ids in (tok.encode_prompt(t) for t in texts) if len(ids) > 1]


CONTEXT = 8192  # the engine's context (max_model_len) for SmolLM2


def docfaq_prompts(tok: HFTokenizer, n: int, max_tokens: int) -> list[tuple[Any, Any]]:
    """(question, chat messages) for the first n docfaq questions: the top 5 passages by
    exact inner product with the query embedded by the service's embedder, the service's
    prompt (rag.answer.prompt.build)."""
    from rag.answer import prompt as prompts
    from rag.embed import SentenceTransformerEmbedder

    faq = DocFaq()
    embedder = SentenceTransformerEmbedder(query_backend="torch")
    out = []
    try:
        for qa in faq.qa[:n]:
            passages = faq.retrieve(embedder, qa.question, k=5)
            built = prompts.build(
                qa.question,
                passages,
                context_tokens=CONTEXT,
                max_tokens=max_tokens,
                count=lambda sp: len(tok.encode_prompt(sp)),
            )
            out.append((qa, built.messages))
    finally:
        embedder.close()
    return out


def score_format(
    args: argparse.Namespace,
    tok: HFTokenizer,
    fmt: str,
    kv: str,
    texts: list[list[int]],
    agree: list[Req],
    faq: list[tuple[Any, Any]],
) -> FormatScores:
    t0 = time.perf_counter()
    with engine_of(args, tok, weights=fmt, kv_dtype=kv, speculative=False) as engine:
        model = engine.runner.model
        kv_dtype = engine.runner.kv_caches.dtype
        nlls: list[float] = []
        for i in range(0, len(texts), 8):
            nlls += prefill_nll(model, texts[i : i + 8], kv_dtype)
        dec = None
        if fmt in ("int8", "int4", "w8a8"):  # a decode kernel of their own (rag.engine.quant)
            kernel = engine.runner.decode_kernel
            dec = [decode_nll(model, kernel, s, kv_dtype) for s in texts[: args.decode_subset]]
        greedy = [stream_engine(engine, r.messages, 64).ids for r in agree]
        answers = run_engine(engine, [Req(m, args.f1_tokens) for _, m in faq], ignore_eos=False)
        f1 = [
            token_f1(tok.decode(ids), qa.answer)
            for (qa, _), ids in zip(faq, answers.outputs, strict=True)
        ]
        mb = weight_bytes(model) / 1e6
    note(f"accuracy {fmt}, KV {kv}: {time.perf_counter() - t0:.0f} s")
    return FormatScores(nlls, dec, greedy, f1, mb)


def part_accuracy(args: argparse.Namespace, tok: HFTokenizer, report: Report) -> None:
    n_text = args.ppl_passages or (100 if args.quick else 1000)
    n_agree = args.agree_prompts or (8 if args.quick else 20)
    n_faq = args.faq_questions or (20 if args.quick else 100)
    texts = held_out(tok, n_text)
    agree = workload(tok, n_agree, (64, 64), (args.ctx_min, args.ctx_max), args.seed + 2)
    faq = docfaq_prompts(tok, n_faq, args.f1_tokens)
    sub = min(args.decode_subset, len(texts))
    note(
        f"accuracy: perplexity over the last {n_text} wiki_vital passages "
        f"({sum(len(t) - 1 for t in texts)} predicted tokens; decode path over the first "
        f"{sub}), greedy agreement over {n_agree} RAG prompts x 64 tokens (batch 1), docfaq "
        f"token F1 over {n_faq} questions (at most {args.f1_tokens} tokens, EOS honoured)"
    )
    # Every weight format over a float32 KV cache, and the default weights over bfloat16 KV.
    default = resolve_weights("auto", resolve_device(args.device), kernels())
    formats = [f for f in FORMATS if f in args.formats.split(",")]
    if "float32" not in formats:
        formats.insert(0, "float32")  # the reference
    if default not in formats:
        formats.append(default)  # the figure is the default's
    variants = [(fmt, "float32") for fmt in formats] + [(default, "bfloat16")]
    scores = {v: score_format(args, tok, *v, texts, agree, faq) for v in variants}
    n_tokens = sum(len(t) - 1 for t in texts)
    n_sub = sum(len(t) - 1 for t in texts[:sub])

    def ppl(total: float, count: int) -> float:
        return math.exp(total / count)

    ref = scores[("float32", "float32")]
    ref_ppl = ppl(sum(ref.nll), n_tokens)
    ref_sub = ppl(sum(ref.nll[:sub]), n_sub)
    rows = []
    for (fmt, kv), s in scores.items():
        p = ppl(sum(s.nll), n_tokens)
        dec = ppl(sum(s.decode_nll), n_sub) if s.decode_nll is not None else float("nan")
        divs = [first_divergence(a, b) for a, b in zip(s.greedy, ref.greedy, strict=True)]
        agree_tok = med(
            [
                sum(x == y for x, y in zip(a, b, strict=False)) / max(1, len(b))
                for a, b in zip(s.greedy, ref.greedy, strict=True)
            ]
        )
        rows.append(
            {
                "weights": fmt,
                "KV": kv,
                "decode MB": s.decode_mb,
                "ppl (prefill)": p,
                "vs float32 %": 100 * (p / ref_ppl - 1),
                f"ppl (decode, {sub} passages)": dec,
                "vs float32, same passages %": 100 * (dec / ref_sub - 1),
                "greedy = float32": f"{sum(d == 64 for d in divs)}/{len(divs)}",
                "mean first divergence": statistics.mean(divs),
                "token agreement (median)": agree_tok,
                "docfaq F1": statistics.mean(s.f1),
            }
        )
    report.table(rows)
    note(f"float32 prefill perplexity over the decode subset: {ref_sub:.3f}")
    shipped = resolve_kv_dtype("auto", torch.float32, resolve_device(args.device), default)
    p_def = ppl(sum(scores[(default, str(shipped).removeprefix("torch."))].nll), n_tokens)
    report.figures["ppl_increase_pct"] = 100 * (p_def / ref_ppl - 1)


# ---------------------------------------------------------------- main


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="reduced sizes: < 15 min on 2 cores")
    ap.add_argument("--parts", default=",".join(PARTS), help=f"comma separated: {PARTS}")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--kv-cache-mb", type=int, default=None, help="3072; --quick 1536")
    ap.add_argument("--max-num-seqs", type=int, default=32)
    ap.add_argument("--budget", type=int, default=512, help="max_num_batched_tokens")
    ap.add_argument(
        "--kv-dtype", default=None, help="the engine's KV format (default: the engine's default)"
    )
    single = ap.add_argument_group("single")
    single.add_argument("--single-tokens", type=int, default=1000, help="prompt tokens")
    single.add_argument("--single-new", type=int, default=256, help="new tokens")
    single.add_argument("--reps", type=int, default=None, help="runs a side (3; --quick 2)")
    burst = ap.add_argument_group("burst")
    burst.add_argument("--requests", type=int, default=None, help="64; --quick 16")
    burst.add_argument("--out-min", type=int, default=16)
    burst.add_argument("--out-max", type=int, default=None, help="256; --quick 96")
    burst.add_argument("--ctx-min", type=int, default=300, help="passage tokens a prompt")
    burst.add_argument("--ctx-max", type=int, default=900)
    burst.add_argument("--rate", type=float, default=None, help="Poisson arrivals per second")
    burst.add_argument("--single", type=int, default=None, help="requests for one-at-a-time")
    burst.add_argument("--hf-batch", type=int, default=None, help="bfloat16 batch: 32; quick 16")
    itl = ap.add_argument_group("itl")
    itl.add_argument("--itl-targets", type=float, nargs="+", default=[100.0, 150.0, 200.0, 220.0])
    itl.add_argument("--itl-p99-max-ms", type=float, default=250.0)
    acc = ap.add_argument_group("accuracy")
    acc.add_argument("--ppl-passages", type=int, default=None, help="1000; --quick 100")
    acc.add_argument("--decode-subset", type=int, default=None, help="100; --quick 10")
    acc.add_argument("--agree-prompts", type=int, default=None, help="20; --quick 8")
    acc.add_argument("--faq-questions", type=int, default=None, help="100; --quick 20")
    acc.add_argument("--f1-tokens", type=int, default=128)
    acc.add_argument(
        "--formats",
        default=",".join(FORMATS),
        help="weight formats to score (float32, the reference, always is); on a CPU that "
        "emulates bfloat16 that format alone takes most of the part",
    )
    args = ap.parse_args()
    args.reps = args.reps or (2 if args.quick else 3)
    args.out_max = args.out_max or (96 if args.quick else 256)
    # 46 KB a token (SmolLM2, float32): 16 prompts of ~1.3k tokens fit in 1.5 GB.
    args.kv_cache_mb = args.kv_cache_mb or (1536 if args.quick else 3072)
    args.decode_subset = args.decode_subset or (10 if args.quick else 100)
    unknown = set(args.parts.split(",")) - set(PARTS)
    if unknown:
        ap.error(f"unknown parts {sorted(unknown)}; choose from {PARTS}")
    return args


def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.threads)
    from transformers import AutoTokenizer

    tok = HFTokenizer(AutoTokenizer.from_pretrained(str(resolve_folder(None, None))))
    report = Report()
    steps = {
        "matmul": part_matmul,
        "single": part_single,
        "burst": part_burst,
        "spec": part_spec,
        "itl": part_itl,
        "accuracy": part_accuracy,
    }
    wanted = args.parts.split(",")
    for name in PARTS:
        if name in wanted:
            t0 = time.perf_counter()
            steps[name](args, tok, report)
            note(f"part {name}: {time.perf_counter() - t0:.0f} s")
    for name, value in report.figures.items():
        if isinstance(value, float) and abs(value) < 1:
            print(f"FIGURE {name} {value:.3g}")
        elif isinstance(value, float):
            print(f"FIGURE {name} {value:.2f}")
        else:
            print(f"FIGURE {name} {value}")


if __name__ == "__main__":
    main()
