"""Inter-token latency under a 16-request burst for each `--itl-targets` value of the
engine's itl_target_ms (and none): ITL p99/p50, tokens/s against no target, time to first
token; the smallest target whose p99 stays under `--itl-p99-max-ms` at >= 0.9x the tokens/s
is the figure.

    python bench/engine_itl.py --quick
    python bench/generate.py --parts itl     # the same, beside the other engine parts

ITL is the gaps between a stream's token events as a client sees them; a gap ending in an
event that carries special tokens counts once per token it carries (with EOS ignored the
model writes on past <|im_end|>, whose tokens have no text). Each target runs in an engine of
its own; without --quick two rounds, forward then backward. Ends with FIGURE itl_p99_ms (nan
when no target met both conditions) and itl_target_ms (the target chosen).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _engine import (  # noqa: E402
    Report,
    Result,
    engine_of,
    note,
    parser,
    ratio,
    run_engine,
    run_parts,
    workload,
)
from _stats import pct  # noqa: E402

from rag.engine.tokenizer import HFTokenizer  # noqa: E402

WORKLOAD = ("ctx", "out")
QUICK = "16 requests, outputs 16-96, one round"  # what --quick measures


def add_arguments(ap: argparse.ArgumentParser) -> None:
    itl = ap.add_argument_group("itl")
    itl.add_argument("--itl-targets", type=float, nargs="+", default=[100.0, 150.0, 200.0, 220.0])
    itl.add_argument("--itl-p99-max-ms", type=float, default=250.0)


def pooled(results: list[Result]) -> Result:
    """Several runs of one workload as one: samples together, tokens over the summed walls."""
    return Result(
        ttft=[x for r in results for x in r.ttft],
        itl=[x for r in results for x in r.itl],
        tokens=sum(r.tokens for r in results),
        wall=sum(r.wall for r in results),
    )


def run(args: argparse.Namespace, tok: HFTokenizer, report: Report) -> None:
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


if __name__ == "__main__":
    ap = parser(__doc__)
    ap.add_argument("--quick", action="store_true", help=QUICK)
    run_parts(ap, {"itl": sys.modules[__name__]})
