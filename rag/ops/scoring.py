"""The scores of an evaluation: a ranking of corpus ids against graded judgements (recall@k,
MRR@k, nDCG@k with linear gains, as trec_eval's ndcg_cut) and an answer against its reference
(token F1 after SQuAD normalisation: lower case, no punctuation or articles)."""

from __future__ import annotations

import math
import re
import string
from collections import Counter
from collections.abc import Iterable, Sequence


def recall_at(ranking: Sequence[str], relevant: dict[str, int], k: int) -> float:
    wanted = {d for d, s in relevant.items() if s > 0}
    if not wanted:
        return 0.0
    return len(wanted & set(ranking[:k])) / len(wanted)


def mrr_at(ranking: Sequence[str], relevant: dict[str, int], k: int = 10) -> float:
    for rank, doc in enumerate(ranking[:k], 1):
        if relevant.get(doc, 0) > 0:
            return 1.0 / rank
    return 0.0


def ndcg_at(ranking: Sequence[str], relevant: dict[str, int], k: int = 10) -> float:
    dcg = sum(
        max(relevant.get(doc, 0), 0) / math.log2(rank + 1)
        for rank, doc in enumerate(ranking[:k], 1)
    )
    ideal = sorted((s for s in relevant.values() if s > 0), reverse=True)[:k]
    idcg = sum(s / math.log2(rank + 1) for rank, s in enumerate(ideal, 1))
    return dcg / idcg if idcg else 0.0


def _normalize(text: str) -> list[str]:
    text = text.lower()
    text = "".join(ch for ch in text if ch not in set(string.punctuation))
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return text.split()


def overlap(pred: list[str], ref: list[str]) -> tuple[float, float, float]:
    """Token F1, precision and recall of two token lists (all 0 when they share none)."""
    common = sum((Counter(pred) & Counter(ref)).values())
    if common == 0:
        return 0.0, 0.0, 0.0
    precision, recall = common / len(pred), common / len(ref)
    return 2 * precision * recall / (precision + recall), precision, recall


def token_f1(prediction: str, reference: str) -> float:
    pred, ref = _normalize(prediction), _normalize(reference)
    if not pred or not ref:
        return float(pred == ref)
    return overlap(pred, ref)[0]


def dedupe(ids: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(ids))
