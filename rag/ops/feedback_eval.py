"""From feedback to an evaluation set: `rag eval COLLECTION --from-feedback`.

Each rated answer whose question was stored becomes a judged query (the latest rating of it
counts, whoever gave it):

- rated up: the answer given is the reference answer, and the documents of the passages it
  was given are relevant;
- rated down with a correction: the correct answer is the reference, and the correct
  document, if named, is the relevant one; rated down without one: skipped (nothing says
  what would be right), and counted.

The set is written in the BEIR layout `rag eval` reads (queries.jsonl, qrels.tsv,
answers.jsonl), naming documents by their corpus ids (metadata `_id`, else filename), so
it can be kept, edited and run again. `candidate` knobs (a change of search settings, such as
what `rag tune` would apply) are measured on the same set beside the collection's current
ones, before anything is stored.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from rag.db import answers as sql
from rag.db import chunks as chunk_sql
from rag.db.models import Collection
from rag.ops.eval import corpus_ids
from rag.services import Services


@dataclass
class FeedbackSet:
    queries: dict[str, str]
    qrels: dict[str, dict[str, int]]
    answers: dict[str, str]
    skipped_no_text: int = 0
    skipped_no_correction: int = 0

    def write(self, folder: Path) -> Path:
        folder.mkdir(parents=True, exist_ok=True)
        with (folder / "queries.jsonl").open("w", encoding="utf-8") as f:
            for qid, text in self.queries.items():
                f.write(json.dumps({"_id": qid, "text": text}, ensure_ascii=False) + "\n")
        with (folder / "qrels.tsv").open("w", encoding="utf-8") as f:
            f.write("query-id\tcorpus-id\tscore\n")
            for qid, docs in self.qrels.items():
                for doc, score in docs.items():
                    f.write(f"{qid}\t{doc}\t{score}\n")
        with (folder / "answers.jsonl").open("w", encoding="utf-8") as f:
            for qid, answer in self.answers.items():
                f.write(json.dumps({"_id": qid, "answer": answer}, ensure_ascii=False) + "\n")
        return folder / "queries.jsonl"


def from_feedback(services: Services, collection: Collection) -> FeedbackSet:
    with services.db.read() as session:
        rated = sql.rated(session, collection.id)
        given = {c for a, _ in rated for c in a.chunk_ids}
        documents = chunk_sql.documents_of_chunks(session, sorted(given))
    names = corpus_ids(services, collection.id)
    latest = {a.id: (a, f) for a, f in rated}  # oldest first: the last rating wins
    out = FeedbackSet({}, {}, {})
    for answer, rating in latest.values():
        if not answer.question:
            out.skipped_no_text += 1
            continue
        if rating.rating == "up":
            reference = answer.answer
            relevant = {documents[c] for c in answer.chunk_ids if c in documents}
        elif rating.correct_answer or rating.correct_document_id:
            reference = rating.correct_answer or ""
            relevant = {rating.correct_document_id} if rating.correct_document_id else set()
        else:
            out.skipped_no_correction += 1
            continue
        judged = {min(names[d]): 1 for d in relevant if d in names}
        if not judged and not reference:
            out.skipped_no_correction += 1
            continue
        out.queries[answer.id] = answer.question
        if judged:
            out.qrels[answer.id] = judged
        if reference:
            out.answers[answer.id] = reference
    return out
