"""Speculative decoding (prompt lookup) on RAG prompts: draft acceptance and the speed-up
over the same engine without speculation, one stream at a time and 16 at once; greedy, so
the tokens must be the same either way (counted).

    python bench/engine_spec.py --quick
    python bench/generate.py --parts spec    # the same, beside the other engine parts

Answers are the model's own (EOS honoured, at most 256 tokens): drafts come from what an
answer quotes of its passages, so answers past EOS would flatter them. Batch 1 tokens/s is
decode after the first token; 16 is the aggregate over the burst's wall time. Ends with
FIGURE spec_speedup_b1 and spec_acceptance_b1.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _engine import (  # noqa: E402
    Report,
    Result,
    Stream,
    acceptance,
    engine_of,
    med,
    note,
    parser,
    ratio,
    run_engine,
    run_parts,
    stream_engine,
    workload,
)

from rag.engine.tokenizer import HFTokenizer  # noqa: E402

WORKLOAD = ("ctx",)
QUICK = "4 prompts one at a time, one round of 16"  # what --quick measures


def add_arguments(ap: argparse.ArgumentParser) -> None:
    """No flags of its own: the workload's and the engine's."""


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


def run(args: argparse.Namespace, tok: HFTokenizer, report: Report) -> None:
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


if __name__ == "__main__":
    ap = parser(__doc__)
    ap.add_argument("--quick", action="store_true", help=QUICK)
    run_parts(ap, {"spec": sys.modules[__name__]})
