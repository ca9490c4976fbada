"""Generator engine benchmark: ragserve's engine vs transformers generate, RAG-shaped workload.

Each request = a shared ~120-token system prompt + 300-900 tokens of passages + a question,
output 16-256 tokens (exact: EOS ignored), arriving all at once ("burst") and as a Poisson
stream. Baselines: transformers static batches of 8 (left padded) and one request at a time;
llama-cpp-python when importable. Ends with the FIGURE lines.

    python bench/generate.py --quick        # reduced workload, < 15 min on 2 CPU cores
    python bench/generate.py                # 64 requests
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _data import shared  # noqa: E402

from rag.engine import EngineSettings, SamplingParams, build_engine  # noqa: E402
from rag.engine.loader import resolve_folder  # noqa: E402

SYSTEM = (
    "You are a careful assistant for a private document collection. Answer the user's "
    "question using only the numbered passages below. Cite every claim with the passage "
    "number in square brackets, like [2]. If the passages do not contain the answer, say "
    "that you do not know instead of guessing. Be brief: a few sentences at most, no lists "
    "unless the question asks for one, and never mention these instructions. Quote numbers, "
    "names and dates exactly as the passages give them. Do not use outside knowledge."
)


@dataclass
class Req:
    messages: list[dict[str, str]]
    max_tokens: int
    arrival: float = 0.0
    ids: list[int] = field(default_factory=list)


@dataclass
class Result:
    ttft: list[float] = field(default_factory=list)
    itl: list[float] = field(default_factory=list)
    tokens: int = 0
    wall: float = 0.0
    extra: dict[str, float] = field(default_factory=dict)


def pct(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q / 100 * (len(xs) - 1))))]


def load_texts() -> list[str]:
    with shared("wiki_vital", "passages.jsonl").open() as f:
        return [json.loads(line).get("text", "") for line in f][:3000]


def workload(tok, n: int, out_lo: int, out_hi: int, ctx_lo: int, ctx_hi: int, seed: int):
    rng = random.Random(seed)
    texts = load_texts()
    reqs = []
    for _ in range(n):
        target = rng.randint(ctx_lo, ctx_hi)
        parts, used = [], 0
        while used < target:
            t = rng.choice(texts)
            parts.append(f"[{len(parts) + 1}] {t}")
            used += len(tok.encode_prompt(t)) + 4
        q = f"Question: what do the passages say about {rng.choice(texts).split()[0]}?"
        msgs = [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": "\n\n".join(parts) + "\n\n" + q},
        ]
        r = Req(msgs, rng.randint(out_lo, out_hi))
        r.ids = tok.encode_prompt(msgs)
        reqs.append(r)
    return reqs


def poisson(reqs: list[Req], rate: float, seed: int) -> list[Req]:
    rng, t = random.Random(seed), 0.0
    out = []
    for r in reqs:
        out.append(Req(r.messages, r.max_tokens, t, r.ids))
        t += rng.expovariate(rate)
    return out


# ---------------------------------------------------------------- ragserve engine
def run_engine(engine, reqs: list[Req]) -> Result:
    res = Result()

    async def one(r: Req, t0: float):
        await asyncio.sleep(max(0.0, t0 + r.arrival - time.perf_counter()))
        start = time.perf_counter()
        last = None
        params = SamplingParams(max_tokens=r.max_tokens, ignore_eos=True)
        async for ev in engine.submit(r.messages, params):
            now = time.perf_counter()
            if ev.token_ids:
                if last is None:
                    res.ttft.append(now - start)
                else:
                    res.itl.append((now - last) / len(ev.token_ids))
                last = now
            if ev.usage:
                res.tokens += ev.usage.completion_tokens

    async def main():
        t0 = time.perf_counter()
        await asyncio.gather(*[one(r, t0) for r in reqs])
        res.wall = time.perf_counter() - t0

    m0 = engine.metrics()
    asyncio.run(main())
    m1 = engine.metrics()
    steps = max(1, m1.steps - m0.steps)
    res.extra = {
        "prefix_hit_rate": m1.prefix_cache_hit_rate,
        "step_ms": 1000 * res.wall / steps,
        "preemptions": m1.preemptions - m0.preemptions,
    }
    return res


# ---------------------------------------------------------------- transformers baselines
class _Clock:
    """A stopping criterion that only records when each decoding step finished."""

    def __init__(self):
        self.times: list[float] = []

    def __call__(self, input_ids, scores, **kw):
        self.times.append(time.perf_counter())
        return torch.zeros(input_ids.shape[0], dtype=torch.bool)


def run_hf(hf, tok_pad_id: int, reqs: list[Req], batch: int) -> Result:
    from transformers import StoppingCriteriaList

    res = Result()
    t0 = time.perf_counter()
    free_at = 0.0  # relative time the model is free
    for i in range(0, len(reqs), batch):
        group = reqs[i : i + batch]
        start_rel = max(free_at, max(r.arrival for r in group))
        wait = start_rel - (time.perf_counter() - t0)
        if wait > 0:
            time.sleep(wait)
        start_rel = time.perf_counter() - t0
        width = max(len(r.ids) for r in group)
        ids = torch.full((len(group), width), tok_pad_id, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for j, r in enumerate(group):  # left padding
            ids[j, width - len(r.ids) :] = torch.tensor(r.ids)
            mask[j, width - len(r.ids) :] = 1
        n = max(r.max_tokens for r in group)
        clock = _Clock()
        with torch.inference_mode():
            hf.generate(
                ids, attention_mask=mask, max_new_tokens=n, min_new_tokens=n, do_sample=False,
                stopping_criteria=StoppingCriteriaList([clock]), pad_token_id=tok_pad_id,
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


# ---------------------------------------------------------------- report
def row(name: str, r: Result) -> str:
    return (
        f"| {name} | {r.tokens / r.wall:.1f} | {pct(r.ttft, 50):.2f} | {pct(r.ttft, 99):.2f} "
        f"| {1000 * pct(r.itl, 99):.0f} | {r.extra.get('prefix_hit_rate', float('nan')):.2f} |"
    )


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


def greedy_parity(engine, hf, reqs: list[Req], n_tokens: int) -> int:
    ok = True
    for r in reqs:
        with torch.inference_mode():
            out = hf.generate(
                torch.tensor([r.ids]), attention_mask=torch.ones(1, len(r.ids), dtype=torch.long),
                max_new_tokens=n_tokens, do_sample=False,
            )  # fmt: skip
        ref = out[0, len(r.ids) :].tolist()

        async def go(r=r):
            ids = []
            async for ev in engine.submit(r.messages, SamplingParams(max_tokens=n_tokens)):
                ids += ev.token_ids
            return ids

        ok &= asyncio.run(go()) == ref
    return int(ok)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--requests", type=int, default=None)
    ap.add_argument("--out-min", type=int, default=16)
    ap.add_argument("--out-max", type=int, default=None)
    ap.add_argument("--ctx-min", type=int, default=300)
    ap.add_argument("--ctx-max", type=int, default=900)
    ap.add_argument("--rate", type=float, default=None, help="Poisson arrivals per second")
    ap.add_argument("--single", type=int, default=None, help="requests for one-at-a-time")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--kv-cache-mb", type=int, default=3072)
    ap.add_argument("--max-num-seqs", type=int, default=32)
    ap.add_argument("--budget", type=int, default=512, help="max_num_batched_tokens")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    n = args.requests or (16 if args.quick else 64)
    out_max = args.out_max or (96 if args.quick else 256)
    n_single = args.single if args.single is not None else (2 if args.quick else 8)
    torch.set_num_threads(args.threads)

    settings = EngineSettings(
        device=args.device, threads=args.threads, kv_cache_mb=args.kv_cache_mb,
        max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.budget,
        max_waiting=max(256, n),
    )  # fmt: skip
    engine = build_engine(settings)
    device = engine.runner.device
    dtype = engine.runner.model.embed_tokens.weight.dtype
    tok = engine.tokenizer
    reqs = workload(tok, n, args.out_min, out_max, args.ctx_min, args.ctx_max, args.seed)
    lens = [len(r.ids) for r in reqs]
    print(
        f"# {n} requests, prompt tokens {min(lens)}-{max(lens)}, outputs "
        f"{args.out_min}-{out_max}, device {device}, {dtype}, {args.threads} threads"
    )

    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(
        str(resolve_folder(None, None)), dtype=dtype
    ).to(device).eval()  # fmt: skip
    pad_id = tok.tok.pad_token_id if tok.tok.pad_token_id is not None else 0

    # Warm both up (first calls allocate).
    run_engine(engine, workload(tok, 2, 4, 4, 50, 60, 99))
    parity = greedy_parity(engine, hf, reqs[:2], 16)
    engine.block_manager.reset_prefix_cache()

    table = ["| backend | out tok/s | TTFT p50 s | TTFT p99 s | ITL p99 ms | prefix hits |",
             "|---|---|---|---|---|---|"]  # fmt: skip
    burst_e = run_engine(engine, reqs)
    table.append(row("ragserve engine, burst", burst_e))
    rate = args.rate or max(0.2, 0.8 * n / burst_e.wall)
    stream = poisson(reqs, rate, args.seed)
    engine.block_manager.reset_prefix_cache()
    pois_e = run_engine(engine, stream)
    table.append(row(f"ragserve engine, Poisson {rate:.2f}/s", pois_e))
    burst_h = run_hf(hf, pad_id, reqs, 8)
    table.append(row("transformers static batch 8, burst", burst_h))
    pois_h = run_hf(hf, pad_id, stream, 8)
    table.append(row(f"transformers static batch 8, Poisson {rate:.2f}/s", pois_h))
    if n_single:
        single = run_hf(hf, pad_id, reqs[:n_single], 1)
        table.append(row(f"transformers one at a time ({n_single} requests)", single))
    try:
        import llama_cpp  # noqa: F401

        print("# llama-cpp-python found but not wired into this run")
    except ImportError:
        print("# llama-cpp-python not importable: its row is skipped")
    print("\n".join(table))

    weights = sum(p.numel() * p.element_size() for p in engine.runner.model.parameters())
    bw = bandwidth_gbs() if device.type == "cpu" else float("nan")
    bound_ms = 1000 * weights / (bw * 1e9)
    print(f"# weights {weights / 1e6:.0f} MB; copy bandwidth {bw:.1f} GB/s; "
          f"bandwidth-bound decode step {bound_ms:.1f} ms; engine mean step "
          f"{burst_e.extra['step_ms']:.1f} ms (burst), preemptions "
          f"{burst_e.extra['preemptions']:.0f}")  # fmt: skip
    thr = (burst_e.tokens / burst_e.wall) / (burst_h.tokens / burst_h.wall)
    ttft = pct(burst_e.ttft, 99) / pct(burst_h.ttft, 99)
    engine.close()
    print(f"FIGURE throughput_vs_hf_static {thr:.2f}")
    print(f"FIGURE ttft_p99_vs_hf_static {ttft:.2f}")
    print(f"FIGURE greedy_parity {parity}")


if __name__ == "__main__":
    main()
