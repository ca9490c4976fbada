"""The evidence step replayed offline: each factual question's retrieved passages, kept once,
then the extractive answer chosen over them again with a given encoder for the evidence step.

    python bench/answers.py --keep DIR --sets wiki,company,wiki2,company2 --every 1000
    python bench/evidence.py passages DIR OUT.jsonl --sets wiki,company,wiki2,company2
    python bench/evidence.py replay OUT.jsonl [--evidence-adapter FOLDER] [--floors 0.45:0.5,...]

`passages` opens the kept data dir of bench/answers.py in this process (the server stopped)
and retrieves for every question as the ask path does with default settings (the passages
over the relevance threshold, the table heads a chunk cut off). `replay` chooses the evidence
over them as `mode: extractive` does (rag.answer.ask) and scores the answer as
bench/answers.py does, by set and half; with `--evidence-adapter`, the evidence step's cosines
come from the bundled encoder with that adapter merged (bench/train_evidence.py); with
`--floors`, the answers under several refusal floors (`ask.min_similarity`, and the cosine a
unit not seen to hold the kind asked for needs) from one choice each. Retrieval is not
repeated, so a replay isolates the evidence step; it matches the server's extractive answers
within a question or two (the server's query encoder runs in int8).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
os.environ.setdefault("HF_HUB_OFFLINE", "1")  # before anything imports huggingface_hub
sys.path.insert(0, str(HERE))

from answers import SETS, holds, questions_of  # noqa: E402

from rag.answer.ask import _choice  # noqa: E402
from rag.answer.evidence import UNSEEN_KIND  # noqa: E402
from rag.answer.extract import extract  # noqa: E402
from rag.answer.units import Head  # noqa: E402
from rag.config import AskSettings, Settings  # noqa: E402
from rag.retrieve import Passage  # noqa: E402

# ---------------------------------------------------------------- passages


def passages(data_dir: Path, out: Path, sets: Sequence[str]) -> None:
    os.environ["RAG_DATA_DIR"] = str(data_dir)
    from sqlalchemy import text

    from rag.answer.ask import _relevance, _table_heads
    from rag.answer.units import starts_in_table
    from rag.knobs import Knobs
    from rag.services import build_services

    saved = json.loads((data_dir / "bench-collections.json").read_text())
    settings = Settings()
    services = build_services(settings, in_process_worker=False, announce_admin_key=False)
    ask = settings.ask
    try:
        with services.db.connect() as conn:
            tenant = {
                s: conn.execute(
                    text("SELECT tenant_id FROM collections WHERE id = :c"), {"c": saved[s]}
                ).scalar_one()  # fmt: skip
                for s in sets
            }
        with out.open("w") as f:
            for q in questions_of(sets):
                r = services.retriever.search(
                    tenant[q.set], saved[q.set], q.question, Knobs(k=ask.default_k),
                    hybrid_default=ask.hybrid,
                )  # fmt: skip
                given = [p for p in r.passages if _relevance(p) >= ask.relevance_threshold]
                heads = None
                if any(p.start_char > 0 and starts_in_table(p.text) for p in given):
                    heads = _table_heads(services, tenant[q.set], given)
                row = {
                    "set": q.set, "qid": q.qid, "half": q.half, "question": q.question,
                    "answers": q.answers, "wrong": q.wrong, "gold": q.gold,
                    "paraphrased": q.paraphrased,
                    "passages": [
                        {"chunk_id": p.chunk_id, "document_id": p.document_id,
                         "filename": p.filename, "text": p.text, "start_char": p.start_char,
                         "end_char": p.end_char, "ordinal": p.ordinal, "score": p.score,
                         "dense_score": p.dense_score, "keyword_score": p.keyword_score}
                        for p in given
                    ],
                    "heads": None if heads is None else [
                        None if h is None else {"row": h.row, "cut": h.cut}
                        for h in heads
                    ],
                }  # fmt: skip
                f.write(json.dumps(row) + "\n")
    finally:
        services.close()


# ---------------------------------------------------------------- replay


def load(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def merged(model: Any, folder: Path) -> Any:
    """A copy of the sentence-transformers `model` with a low-rank adapter (peft's format,
    bench/train_evidence.py) merged into its transformer: each adapted linear layer's weight
    W becomes W + (alpha / r) B A."""
    import copy

    import torch
    from safetensors.torch import load_file

    config = json.loads((folder / "adapter_config.json").read_text())
    scale = float(config["lora_alpha"]) / int(config["r"])
    pairs: dict[str, dict[str, torch.Tensor]] = {}
    for key, value in load_file(str(folder / "adapter_model.safetensors")).items():
        # base_model.model.<layer path>.lora_A.weight
        path, _, kind = key.removeprefix("base_model.model.").rpartition(".lora_")
        pairs.setdefault(path, {})[kind.split(".")[0]] = value
    out = copy.deepcopy(model)
    layers = dict(out[0].auto_model.named_modules())
    with torch.no_grad():
        for path, ab in pairs.items():
            layers[path].weight += scale * (ab["B"].float() @ ab["A"].float())
    return out


def encoder(adapter: str | None) -> Callable[[list[str]], np.ndarray]:
    from sentence_transformers import SentenceTransformer

    from rag.embed.sentence import bundled_minilm_path

    model = SentenceTransformer(bundled_minilm_path(), device="cpu")
    if adapter is not None:
        model = merged(model, Path(adapter))

    def embed(texts: list[str]) -> np.ndarray:
        return np.asarray(model.encode(texts, normalize_embeddings=True, batch_size=64))

    return embed


def heads_of(row: dict[str, Any]) -> list[Head | None] | None:
    """The table heads `passages` wrote for the row's passages, as the ask path has them."""
    if row["heads"] is None:
        return None
    return [None if h is None else Head(row=h["row"], cut=h["cut"]) for h in row["heads"]]


def answer(
    row: dict[str, Any],
    embed: Callable[[list[str]], np.ndarray] | None,
    ask: AskSettings,
    floors: Sequence[tuple[float, float]] = (),
) -> list[tuple[str, str]]:
    """(answer_source, answer) of the extractive mode over the row's passages: with the
    settings' floors, or with each (min_similarity, unseen kind's cosine) of `floors`."""
    given = [Passage(metadata={}, **p) for p in row["passages"]]
    floors = floors or [(ask.min_similarity, UNSEEN_KIND)]
    choice = _choice(row["question"], given, embed, heads_of(row)) if given else None
    if choice is None:
        return [("refused", "")] * len(floors)
    got = extract(given, choice, max_sentences=ask.extract_sentences,
                  max_words=ask.extract_words)  # fmt: skip
    return [
        ("quoted", got.answer)
        if choice.answerable(ask.advanced.min_support, floor, unseen_kind=unseen)
        else ("refused", "")
        for floor, unseen in floors
    ]


def replay(
    rows: list[dict[str, Any]],
    embed: Callable[[list[str]], np.ndarray] | None,
    floors: Sequence[tuple[float, float]] = (),
) -> None:
    ask = Settings().ask
    answers = [answer(row, embed, ask, floors) for row in rows]
    for n, floor in enumerate(floors or [None]):
        if floor is not None:
            print(f"\nmin_similarity {floor[0]}, an unseen kind's cosine {floor[1]}:\n")
        table(rows, [a[n] for a in answers])


def table(rows: list[dict[str, Any]], answers: list[tuple[str, str]]) -> None:
    results: dict[tuple[str, str], list[tuple[dict[str, Any], str, str]]] = {}
    for row, (source, text) in zip(rows, answers, strict=True):
        results.setdefault((row["set"], row["half"]), []).append((row, source, text))
    print("| set | half | correct | refused (unanswerable) | false refusals |")
    print("|---|---|---|---|---|")
    for (s, half), outs in sorted(results.items(), key=lambda kv: (SETS.index(kv[0][0]), kv[0][1])):
        ans = [(r, src, t) for r, src, t in outs if r["answers"]]
        una = [(r, src, t) for r, src, t in outs if not r["answers"]]
        right = sum(holds(t, r["answers"], r["wrong"]) for r, _, t in ans)
        refused = sum(src == "refused" for _, src, _ in una)
        false = sum(src == "refused" for _, src, _ in ans)
        print(f"| {s} | {half} | {right / max(1, len(ans)):.3f} ({right}/{len(ans)}) | "
              f"{refused / max(1, len(una)):.3f} ({refused}/{len(una)}) | "
              f"{false / max(1, len(ans)):.3f} |")  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
    p = sub.add_parser("passages")
    p.add_argument("data_dir")
    p.add_argument("out")
    p.add_argument("--sets", default=",".join(SETS))
    r = sub.add_parser("replay")
    r.add_argument("passages")
    r.add_argument("--evidence-adapter", help="an adapter folder (bench/train_evidence.py)")
    r.add_argument("--sets", default=",".join(SETS))
    r.add_argument("--floors", default="", help="MIN_SIMILARITY:UNSEEN,... side by side")
    args = ap.parse_args()
    if args.command == "passages":
        passages(Path(args.data_dir), Path(args.out), args.sets.split(","))
    else:
        sets = args.sets.split(",")
        rows = [row for row in load(Path(args.passages)) if row["set"] in sets]
        floors = [(float(a), float(b)) for a, b in
                  (f.split(":") for f in args.floors.split(",") if f)]  # fmt: skip
        replay(rows, encoder(args.evidence_adapter), floors)


if __name__ == "__main__":
    main()
