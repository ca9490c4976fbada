"""Unanswered topics: the questions a collection refused, or answered from weak evidence,
clustered by meaning, the most missing evidence first, so an owner sees which documents are
missing.

Agglomerative clustering (scikit-learn) of the questions' embeddings with average linkage
under cosine distance, cut at `quality.advanced.topic_distance`: the number of topics is not
fixed in advance, and a stray question stays alone rather than diluting a topic. At most
`quality.advanced.topics_max_questions` (the newest) are clustered, on request: nothing of a
topic is stored, so there is nothing to erase beyond the answers themselves.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt
from sklearn.cluster import AgglomerativeClustering

from rag.db.answers import Asked

F32 = npt.NDArray[np.float32]
EXAMPLES = 5


@dataclass
class Topic:
    count: int
    refused: int
    examples: list[str]  # the questions nearest the topic's centre (none when not stored)
    documents: list[str]  # ids of the documents its questions retrieved most
    first_at: float
    last_at: float
    members: list[str] = field(default_factory=list)  # answer ids
    mean_top_score: float | None = None  # of its questions' best passages


def labels(embeddings: F32, distance: float) -> npt.NDArray[np.int64]:
    """A cluster label per row (unit vectors), cut at cosine distance `distance`."""
    if len(embeddings) < 2:
        return np.zeros(len(embeddings), dtype=np.int64)
    model = AgglomerativeClustering(
        n_clusters=None, distance_threshold=distance, metric="cosine", linkage="average"
    )
    return np.asarray(model.fit_predict(embeddings), dtype=np.int64)


def topics(
    asked: list[Asked],
    documents: dict[str, list[str]],
    *,
    distance: float,
    weak_score: float = 0.35,
    min_count: int = 2,
) -> list[Topic]:
    """Topics of at least `min_count` questions, the most missing evidence first: a topic
    weighs its count times how far its questions' best passages fall below `weak_score`
    (a question with no passage at all counts as scoring 0). Size alone put a cluster of
    questions that just missed the cut (the documents nearly answer them) above a subject
    nothing covers."""
    if not asked:
        return []
    x = np.vstack([np.frombuffer(a.embedding, dtype="<f4") for a in asked]).astype(np.float32)
    found = labels(x, distance)
    out = []
    for label in np.unique(found):
        idx = np.flatnonzero(found == label)
        if len(idx) < min_count:
            continue
        centre = x[idx].mean(axis=0)
        nearest = idx[np.argsort(-(x[idx] @ centre), kind="stable")]
        members = [asked[i] for i in nearest]
        docs = Counter(d for a in members for d in documents.get(a.id, []))
        out.append(
            Topic(
                count=len(idx),
                refused=sum(a.refused for a in members),
                examples=[a.question for a in members if a.question][:EXAMPLES],
                documents=[d for d, _ in docs.most_common(3)],
                first_at=min(a.created_at for a in members),
                last_at=max(a.created_at for a in members),
                members=[a.id for a in members],
                mean_top_score=float(np.mean([a.top_score or 0.0 for a in members])),
            )
        )

    def missing(t: Topic) -> float:
        return t.count * max(weak_score - (t.mean_top_score or 0.0), 0.01)

    out.sort(key=lambda t: (-missing(t), -t.count, -t.last_at))
    return out
