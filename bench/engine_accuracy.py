"""Accuracy per weight format (float32 = the dequantized GGUF, bfloat16, int8, int4, w8a8):
perplexity on held-out wiki_vital passages through the prefill path and (the int formats, a
subset) through the decode path, greedy agreement with float32 over RAG prompts, docfaq
answer token F1; every format over a float32 KV cache, and the default weights over the
default KV format as well.

    python bench/engine_accuracy.py --quick                        # 100 passages, 8, 20
    python bench/engine_accuracy.py --quick --formats float32,w8a8  # fewer formats
    python bench/generate.py --parts accuracy   # the same, beside the other engine parts

Timings do not matter here, so a busy machine is fine. On a CPU that emulates bfloat16 that
format alone takes most of the run (`--formats`). Ends with FIGURE ppl_increase_pct: the
default weights and KV format against float32, prefill perplexity, in percent.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
from _data import shared  # noqa: E402
from _docfaq import DocFaq, token_f1  # noqa: E402
from _engine import (  # noqa: E402
    Report,
    Req,
    engine_of,
    first_divergence,
    med,
    note,
    parser,
    run_engine,
    run_parts,
    stream_engine,
    workload,
)

from rag.engine.build import resolve_device, resolve_kv_dtype, resolve_weights  # noqa: E402
from rag.engine.kernels import kernels  # noqa: E402
from rag.engine.model import AttentionMetadata, LlamaModel  # noqa: E402
from rag.engine.quant import FORMATS, weight_bytes  # noqa: E402
from rag.engine.tokenizer import HFTokenizer  # noqa: E402

WORKLOAD = ("ctx",)
QUICK = "100 passages, 10 through decode, 8 prompts, 20 questions"  # what --quick measures


def add_arguments(ap: argparse.ArgumentParser) -> None:
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


def defaults(args: argparse.Namespace) -> None:
    args.decode_subset = args.decode_subset or (10 if args.quick else 100)


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


def run(args: argparse.Namespace, tok: HFTokenizer, report: Report) -> None:
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


if __name__ == "__main__":
    ap = parser(__doc__)
    ap.add_argument("--quick", action="store_true", help=QUICK)
    run_parts(ap, {"accuracy": sys.modules[__name__]})
