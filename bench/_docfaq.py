"""The docfaq question-answer set for answer-quality benchmarks: FAQ questions with the FAQ's
own answer, retrieved over the Python/Perl documentation passages with their precomputed
all-MiniLM-L6-v2 vectors (../shared/data/docfaq), and SQuAD-style token F1."""

from __future__ import annotations

import json
import re
import string
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
from _data import shared

from rag.ops.scoring import overlap


@dataclass(frozen=True)
class Passage:
    """What rag.answer.prompt needs of a retrieved passage."""

    chunk_id: int
    text: str
    filename: str
    score: float
    dense_score: float | None = None


@dataclass(frozen=True)
class QA:
    qid: str
    question: str
    answer: str
    doc_ids: tuple[str, ...]


class DocFaq:
    def __init__(self) -> None:
        root = shared("docfaq")
        rows = [json.loads(line) for line in (root / "corpus.jsonl").open()]
        by_id = {r["_id"]: r for r in rows}
        ids = (root / "emb_minilm.ids.txt").read_text().split()
        self.ids = ids
        self.rows = [by_id[i] for i in ids]
        self.vectors: npt.NDArray[np.float32] = np.load(root / "emb_minilm.npy").astype(np.float32)
        self.qa = [
            QA(q["qid"], q["question"], q["answer"], tuple(q.get("doc_ids") or ()))
            for q in (json.loads(line) for line in (root / "qa.jsonl").open())
        ]

    def retrieve(self, embedder: Any, question: str, k: int = 5) -> list[Passage]:
        """The top-k passages by exact inner product (chunk_id: the passage's row)."""
        return exact_top(self.vectors, self.rows, embedder, question, k)


def exact_top(
    vectors: npt.NDArray[np.float32], rows: list[dict[str, Any]], embedder: Any, question: str,
    k: int, suffix: str = "",
) -> list[Passage]:  # fmt: skip
    """The k rows whose vectors have the highest inner product with the question's, as
    passages (chunk_id: the row; filename: its title + `suffix`)."""
    q = np.asarray(embedder.embed([question]), dtype=np.float32)[0]
    scores = vectors @ q
    top = np.argsort(-scores)[:k]
    return [
        Passage(
            int(i),
            rows[i]["text"],
            f"{rows[i]['title']}{suffix}",
            float(scores[i]),
            float(scores[i]),
        )  # fmt: skip
        for i in top
    ]


_MARKER = re.compile(r"\[\d+(?:\s*,\s*\d+)*\]")
_ARTICLES = re.compile(r"\b(a|an|the)\b")


def normalise(text: str) -> list[str]:
    text = _MARKER.sub(" ", text.lower())
    text = "".join(ch if ch not in string.punctuation else " " for ch in text)
    return _ARTICLES.sub(" ", text).split()


def token_f1(prediction: str, reference: str) -> float:
    """rag.ops.scoring's token F1, over this normalisation (citation markers removed)."""
    pred, ref = normalise(prediction), normalise(reference)
    if not pred or not ref:
        return float(pred == ref)
    return overlap(pred, ref)[0]
