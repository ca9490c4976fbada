"""One stream against llama.cpp: a ~1,000-token RAG prompt, 256 new tokens (EOS ignored),
time to first token and decode tokens/s of the engine (defaults, speculative on; and
speculative off) against llama-cpp-python on the same GGUF and the same token ids, the sides
alternating, medians of `--reps` runs a side.

    python bench/engine_single.py --quick
    python bench/generate.py --parts single      # the same, beside the other engine parts

llama-cpp-python comes with the `bench` extra (on an AMX machine build it with
CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX512=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON":
its AMX path crashed in the first decode there); without it the llama.cpp side is skipped,
and said to be. Ends with FIGURE decode_vs_llamacpp and ttft_vs_llamacpp.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _engine import (  # noqa: E402
    Report,
    Stream,
    acceptance,
    describe,
    engine_of,
    first_divergence,
    load_texts,
    med,
    note,
    parser,
    rag_request,
    ratio,
    release,
    run_parts,
    stream_engine,
)

from rag.engine.loader import bundled_gguf_path  # noqa: E402
from rag.engine.tokenizer import HFTokenizer  # noqa: E402

QUICK = "2 runs a side"  # what --quick measures


def add_arguments(ap: argparse.ArgumentParser) -> None:
    single = ap.add_argument_group("single")
    single.add_argument("--single-tokens", type=int, default=1000, help="prompt tokens")
    single.add_argument("--single-new", type=int, default=256, help="new tokens")
    single.add_argument("--reps", type=int, default=None, help="runs a side (3; --quick 2)")


def defaults(args: argparse.Namespace) -> None:
    args.reps = args.reps or (2 if args.quick else 3)


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


def run(args: argparse.Namespace, tok: HFTokenizer, report: Report) -> None:
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


if __name__ == "__main__":
    ap = parser(__doc__)
    ap.add_argument("--quick", action="store_true", help=QUICK)
    run_parts(ap, {"single": sys.modules[__name__]})
