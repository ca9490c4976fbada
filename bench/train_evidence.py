"""Tune the evidence step's encoder: a low-rank adapter over the bundled all-MiniLM-L6-v2,
trained to put the sentence or table row that answers a question closest to it.

    python bench/evidence.py passages DIR PASSAGES.jsonl       # the questions' passages
    python bench/train_evidence.py PASSAGES.jsonl OUT --sets wiki,company,wiki2,company2 \
        --halves a
    python bench/evidence.py replay PASSAGES.jsonl --evidence-adapter OUT

The evidence step (rag.answer.evidence) compares a question with the units (sentences, table
rows) of its passages twice: as written against each unit with its title and heading, and
with the subject taken out of both. Both comparisons are trained here, on the units of the
passages retrieved for each question of the sets and halves named: a unit that holds an
accepted answer in the gold document is a positive, every other unit of the question a
negative. Two losses: a softmax over each answerable question's units (the one that answers
comes first), and a logistic loss that keeps each unit's cosine on its side of the refusal
floor (`ask.min_similarity`), so that a question no unit answers finds none close enough.

What is saved is the adapter alone (`adapter_config.json` and `adapter_model.safetensors`,
peft's format, a few MB); `evidence.py replay --evidence-adapter` merges it into a copy of the
bundled weights. Training needs peft (the bench extra). The service ships no adapter: trained
on two sets, this one moved the other two by a few questions (docs/decisions.md).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from answers import stands  # noqa: E402
from evidence import heads_of, load  # noqa: E402


def examples(rows: list[dict[str, Any]], limit: int, seed: int) -> list[dict[str, Any]]:
    """Per question: the two forms of it and of each unit, and which units answer."""
    from rag.answer.cite import terms
    from rag.answer.evidence import _body, _described, _title, _without
    from rag.answer.question import question_names
    from rag.answer.units import units

    rng = random.Random(seed)
    out = []
    for row in rows:
        question = row["question"]
        wanted = terms(question)
        names = question_names(question) & wanted if wanted else question_names(question)
        titles = [p["filename"] for p in row["passages"]]
        heads = heads_of(row) or [None] * len(row["passages"])
        full, gist, label = [], [], []
        for i, (p, head) in enumerate(zip(row["passages"], heads, strict=True)):
            title = _title(titles, i)
            named = terms(title)
            for u in units(p["text"], starts_document=p["start_char"] == 0, head=head):
                body = _body(p["text"], u)
                full.append(_described(p["text"], u, title))
                gist.append(_without(body, names | named))
                hit = any(stands(a, body) for a in row["answers"]) and not any(
                    stands(w, body) for w in row["wrong"]
                )
                label.append(bool(row["answers"]) and p["filename"] == row["gold"] and hit)
        if not full:
            continue
        keep = [n for n in range(len(full)) if label[n]]
        rest = [n for n in range(len(full)) if not label[n]]
        rng.shuffle(rest)
        keep += rest[: max(0, limit - len(keep))]
        out.append({
            "question": question, "asked": _without(question, names),
            "full": [full[n] for n in keep], "gist": [gist[n] for n in keep],
            "label": [label[n] for n in keep],
        })  # fmt: skip
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("passages")
    ap.add_argument("out")
    ap.add_argument("--sets", default="wiki,company,wiki2,company2")
    ap.add_argument("--halves", default="a", help="a, b or a,b")
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--lr", type=float, default=2e-4)
    ap.add_argument("--units", type=int, default=12, help="units a question, at most")
    ap.add_argument("--max-length", type=int, default=64, help="tokens a text, at most")
    ap.add_argument("--floor", type=float, default=0.45, help="the refusal floor's cosine")
    ap.add_argument("--scale", type=float, default=20.0, help="the softmax's inverse temperature")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    from peft import LoraConfig, get_peft_model
    from sentence_transformers import SentenceTransformer

    from rag.embed.sentence import bundled_minilm_path

    torch.manual_seed(args.seed)
    sets, halves = set(args.sets.split(",")), set(args.halves.split(","))
    rows = [r for r in load(Path(args.passages)) if r["set"] in sets and r["half"] in halves]
    data = examples(rows, args.units, args.seed)
    print(f"{len(data)} questions, {sum(map(lambda d: any(d['label']), data))} with a unit that "
          f"answers, {sum(len(d['full']) for d in data)} units", flush=True)  # fmt: skip

    st = SentenceTransformer(bundled_minilm_path(), device="cpu")
    tokenizer = st.tokenizer
    config = LoraConfig(r=args.rank, lora_alpha=2 * args.rank, lora_dropout=0.1,
                        target_modules=["query", "key", "value", "dense"])  # fmt: skip
    model = get_peft_model(st[0].auto_model, config)
    model.print_trainable_parameters()
    optim = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=args.lr)
    steps = args.epochs * len(data)
    sched = torch.optim.lr_scheduler.LambdaLR(
        optim, lambda s: min(1.0, s / max(1, steps // 20)) * max(0.0, 1 - s / steps)
    )

    def embed(texts: list[str]) -> torch.Tensor:
        enc = tokenizer(
            texts, padding=True, truncation=True, max_length=args.max_length, return_tensors="pt"
        )
        hidden = model(**enc).last_hidden_state
        mask = enc["attention_mask"].unsqueeze(-1).to(hidden.dtype)
        pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
        return torch.nn.functional.normalize(pooled, dim=-1)

    bce = torch.nn.functional.binary_cross_entropy_with_logits
    rng = random.Random(args.seed)
    t0 = time.perf_counter()
    model.train()
    for epoch in range(args.epochs):
        rng.shuffle(data)
        total = 0.0
        for i, d in enumerate(data):
            v = embed([d["question"], d["asked"], *d["full"], *d["gist"]])
            n = len(d["full"])
            cos = torch.stack([v[2 : 2 + n] @ v[0], v[2 + n :] @ v[1]])  # (2, n)
            label = torch.tensor(d["label"], dtype=torch.float32)
            loss = bce(args.scale * (cos.max(0).values - args.floor), label)
            if label.any():
                logits = args.scale * cos
                pos = logits.masked_fill(label == 0, float("-inf")).logsumexp(-1)
                loss = loss + (logits.logsumexp(-1) - pos).mean()
            optim.zero_grad()
            loss.backward()
            optim.step()
            sched.step()
            total += float(loss.detach())
            if (i + 1) % 100 == 0:
                print(f"  {i + 1} questions ({time.perf_counter() - t0:.0f} s)", flush=True)
        print(f"epoch {epoch + 1}: loss {total / len(data):.4f} "
              f"({time.perf_counter() - t0:.0f} s)", flush=True)  # fmt: skip
    out = Path(args.out)
    model.save_pretrained(str(out))
    (out / "trained.json").write_text(
        json.dumps(
            {**vars(args), "questions": len(data), "seconds": round(time.perf_counter() - t0)}
        )
    )
    print(f"saved to {out}")


if __name__ == "__main__":
    main()
