"""Can the bundled generator rerank what dense retrieval found? Query likelihood, measured.

    python bench/rerank.py                  # every answerable question of both factual sets
    python bench/rerank.py --quick          # every third
    python bench/rerank.py --keep DIR       # the data dir of bench/answers.py --keep DIR

No cross-encoder ships offline here, so the answers issue asked whether the generator can be
its own reranker: query likelihood (unsupervised passage reranking with a language model,
UPR), the mean log-probability of the question's tokens given a passage, in the chat template
the model was tuned with ("Passage: ... Write a question this passage answers." then the
question as the assistant's turn). The server retrieves (`/search`, k passages, default
settings, the collections of bench/answers.py); the scoring runs here, on the same weights as
the engine (the bundled GGUF, de-quantized to float32, through transformers), one passage per
forward pass, as a batched prefill would score them.

Per set and half: gold at rank 1 (the share of answerable questions whose first passage is
the gold document's) and MRR over the k passages, for the dense order, the query-likelihood
order, and their fusion (z-scored within a question, weight `--fuse`); and the scoring's cost,
ms per passage on this CPU (a lower bound on what it adds to a first token when the passages
were never seen: the engine would prefill them anyway for the answer, but k of them, not one).

Ends with FIGURE rerank_gold_at1_dense, rerank_gold_at1_ql, rerank_gold_at1_fused (the lowest
over the sets), rerank_ms_per_passage.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

import answers as A  # noqa: E402

ASK = "Passage: {passage}\n\nWrite a question this passage answers."


def retrieve(data_dir: Path, questions: list[A.Question], k: int) -> list[list[dict[str, Any]]]:
    docs = A.wiki_docs()
    sets = sorted({q.set for q in questions}, key=["wiki", "company"].index)
    out = []
    with A.served(data_dir, sets, docs) as (client, h, saved):
        for q in questions:
            r = client.post(f"/v1/collections/{saved[q.set]}/search",
                            json={"query": q.question, "k": k}, headers=h)  # fmt: skip
            r.raise_for_status()
            out.append(r.json()["passages"])
    return out


class Scorer:
    """Query likelihood with the bundled model's weights."""

    def __init__(self) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from rag.engine.loader import resolve_folder

        folder = resolve_folder(None, None)
        self.torch = torch
        self.tok = AutoTokenizer.from_pretrained(str(folder))
        self.model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()

    def score(self, question: str, passage: str) -> float:
        """The mean log-probability of the question's tokens after the passage."""
        torch = self.torch
        user = [{"role": "user", "content": ASK.format(passage=passage)}]
        head = self.tok.apply_chat_template(user, add_generation_prompt=True, tokenize=False)
        prefix = self.tok(head, add_special_tokens=False)["input_ids"]
        target = self.tok(question, add_special_tokens=False)["input_ids"]
        ids = torch.tensor([prefix + target])
        with torch.inference_mode():
            logits = self.model(ids).logits[0, len(prefix) - 1 : -1].float()
        logp = torch.log_softmax(logits, dim=-1)
        picked = logp.gather(1, torch.tensor(target).unsqueeze(1)).squeeze(1)
        return float(picked.mean())


def _z(xs: list[float]) -> list[float]:
    if len(xs) < 2:
        return [0.0 for _ in xs]
    mu, sd = statistics.fmean(xs), statistics.pstdev(xs) or 1.0
    return [(x - mu) / sd for x in xs]


def rank_of(order: list[int], files: list[str], gold: str | None) -> int | None:
    for r, i in enumerate(order):
        if files[i] == gold:
            return r
    return None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--every", type=int, help="every n-th question (default 1, quick 3)")
    ap.add_argument("--k", type=int, default=5)
    ap.add_argument("--fuse", type=float, default=0.5, help="query likelihood's weight (z)")
    ap.add_argument("--keep", help="the data dir to use and keep (bench/answers.py --keep)")
    args = ap.parse_args()
    every = args.every or (3 if args.quick else 1)

    by_id = {d["_id"]: A.wiki_filename(d) for d in A.wiki_docs()}
    questions = [
        q
        for q in A.thin(A.load_questions(HERE / "qa" / "wiki_factual.jsonl", "wiki", by_id), every)
        + A.thin(A.load_questions(HERE / "qa" / "company_factual.jsonl", "company", None), every)
        if q.answerable
    ]
    tmp = tempfile.TemporaryDirectory()
    found = retrieve(Path(args.keep or tmp.name), questions, args.k)

    scorer = Scorer()
    rows: list[tuple[A.Question, int | None, int | None, int | None]] = []
    spent, scored = 0.0, 0
    for q, passages in zip(questions, found, strict=True):
        files = [p["filename"] for p in passages]
        dense = [p["dense_score"] if p["dense_score"] is not None else p["score"] for p in passages]
        t = time.perf_counter()
        ql = [scorer.score(q.question, p["text"]) for p in passages]
        spent += time.perf_counter() - t
        scored += len(passages)
        n = range(len(passages))
        fused = [d + args.fuse * s for d, s in zip(_z(dense), _z(ql), strict=True)]
        orders = [list(n), sorted(n, key=lambda i: -ql[i]), sorted(n, key=lambda i: -fused[i])]
        ranks = [rank_of(o, files, q.gold) for o in orders]
        rows.append((q, *ranks))
        if len(rows) % 20 == 0:
            print(f"  {len(rows)}/{len(questions)} questions scored", flush=True)

    print(f"\n{len(rows)} answerable questions (every {every}), k = {args.k}, "
          f"fusion weight {args.fuse}\n")  # fmt: skip
    print("| set | half | n | gold found | gold at 1: dense | query likelihood | fused "
          "| MRR: dense | query likelihood | fused |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|")
    worst = [1.0, 1.0, 1.0]
    for s in ("wiki", "company"):
        for half in ("a", "b", "both"):
            mine = [r for r in rows if r[0].set == s and (half == "both" or r[0].half == half)]
            if not mine:
                continue
            n = len(mine)
            at1 = [sum(r[1 + j] == 0 for r in mine) / n for j in range(3)]
            mrr = [sum(1 / (r[1 + j] + 1) for r in mine if r[1 + j] is not None) / n
                   for j in range(3)]  # fmt: skip
            found_n = sum(r[1] is not None for r in mine) / n
            print(f"| {s} | {half} | {n} | {found_n:.3f} | {at1[0]:.3f} | {at1[1]:.3f} | "
                  f"{at1[2]:.3f} | {mrr[0]:.3f} | {mrr[1]:.3f} | {mrr[2]:.3f} |")  # fmt: skip
            if half == "both":
                worst = [min(w, a) for w, a in zip(worst, at1, strict=True)]
    ms = 1000 * spent / max(1, scored)
    print(f"\nscoring: {ms:.1f} ms per passage (float32, transformers, this CPU)\n")
    print(f"FIGURE rerank_gold_at1_dense {worst[0]:.3f}")
    print(f"FIGURE rerank_gold_at1_ql {worst[1]:.3f}")
    print(f"FIGURE rerank_gold_at1_fused {worst[2]:.3f}")
    print(f"FIGURE rerank_ms_per_passage {ms:.1f}")


if __name__ == "__main__":
    main()
