"""The engine's CPU kernels per weight format: one decoder layer's four linears (SmolLM2's
shapes, random weights, in cache) at 1-512 input rows through float32 and bfloat16 matmuls
(torch), the weight-only quantized kernel (int4) and w8a8's integer kernel (8-bit
activations, quantizing included), the median of alternating rounds; then whole engine steps
built by hand (the runner, no scheduler): B decodes at context 800 with and without a prompt
chunk of P tokens after 600 cached ones, int4 against w8a8.

    python bench/engine_matmul.py --quick
    python bench/generate.py --parts matmul  # the same, beside the other engine parts

Ends with FIGURE w8a8_vs_int4_decode16 and w8a8_vs_int4_prefill512: an engine step's time
under w8a8 over int4's, 16 decodes at context 800, and a 512-token prompt chunk after 600
(under 1: w8a8 is faster).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
from _engine import Report, engine_of, med, note, parser, run_parts  # noqa: E402

from rag.engine import SamplingParams  # noqa: E402
from rag.engine.kernels import kernels  # noqa: E402
from rag.engine.tokenizer import HFTokenizer  # noqa: E402

QUICK = "1-256 rows, fewer rounds and engine steps"  # what --quick measures


def add_arguments(ap: argparse.ArgumentParser) -> None:
    """No flags of its own: --quick sizes the rows and rounds."""


def run(args: argparse.Namespace, tok: HFTokenizer, report: Report) -> None:
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
    for name, cell in (("decode16", (16, 0)), ("prefill512", (0, 512))):
        report.figures[f"w8a8_vs_int4_{name}"] = cols["w8a8"][cell] / cols["int4"][cell]


if __name__ == "__main__":
    ap = parser(__doc__)
    ap.add_argument("--quick", action="store_true", help=QUICK)
    run_parts(ap, {"matmul": sys.modules[__name__]})
