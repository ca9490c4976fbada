"""A burst of RAG requests against transformers: requests arriving at once (and as a Poisson
stream), aggregate output tokens/s of the engine (defaults) against transformers' `generate`
in static batches (float32 batch 8, bfloat16 batch 32; --quick 16) and against the engine in
float32 weights without speculation; time to first token p50/p99, inter-token latency p99,
prefix-cache hits; the engine's mean step against the memory-bandwidth bound; greedy parity
of the engine (float32 weights) with transformers, token for token.

    python bench/engine_burst.py --quick     # 16 requests, outputs 16-96
    python bench/engine_burst.py             # 64 requests, outputs 16-256 (the issue's)
    python bench/generate.py --parts burst   # the same, beside the other engine parts

Every backend produces exactly the same number of tokens (EOS ignored). A static batch waits
for its 8th request and for the previous batch, and decodes for its longest member. Without
--quick, transformers also runs the Poisson stream and `--single` requests one at a time.
Ends with FIGURE burst_vs_hf_bf16, burst_vs_hf_strongest (against the faster transformers
row: bfloat16 is emulated on CPUs without AVX512-BF16 or AMX), burst_vs_float32_nospec,
throughput_vs_hf_static, ttft_p99_vs_hf_static, greedy_parity.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
from _engine import (  # noqa: E402
    Report,
    Req,
    Result,
    describe,
    engine_of,
    note,
    parser,
    poisson,
    ratio,
    release,
    run_engine,
    run_parts,
    stream_engine,
    workload,
)
from _stats import pct  # noqa: E402

from rag.engine.loader import resolve_folder  # noqa: E402
from rag.engine.quant import native_bf16, weight_bytes  # noqa: E402
from rag.engine.tokenizer import HFTokenizer  # noqa: E402

WORKLOAD = ("ctx", "out")
QUICK = "16 requests, outputs 16-96, no transformers Poisson row"  # what --quick measures


def add_arguments(ap: argparse.ArgumentParser) -> None:
    burst = ap.add_argument_group("burst")
    burst.add_argument("--requests", type=int, default=None, help="64; --quick 16")
    burst.add_argument("--rate", type=float, default=None, help="Poisson arrivals per second")
    burst.add_argument("--single", type=int, default=None, help="requests for one-at-a-time")
    burst.add_argument("--hf-batch", type=int, default=None, help="bfloat16 batch: 32; quick 16")


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


def run(args: argparse.Namespace, tok: HFTokenizer, report: Report) -> None:
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


if __name__ == "__main__":
    ap = parser(__doc__)
    ap.add_argument("--quick", action="store_true", help=QUICK)
    run_parts(ap, {"burst": sys.modules[__name__]})
