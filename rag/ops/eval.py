"""Retrieval and answer quality of a collection against BEIR-style judgements.

Inputs: queries, qrels and (optionally) reference answers in the BEIR layout, read by
rag.ops.judgements (`read_queries`, `read_qrels`, `read_answers`, re-exported here); the
metrics are in rag.ops.scoring.

Corpus ids name documents: a document's corpus id is its metadata key `_id` when it has one
(upload with `metadata={"_id": "doc-17"}`), otherwise its filename, and its filename without
the extension matches too (so `doc-17.txt` answers for corpus id `doc-17`).

Retrieval metrics are per document: the ranking is the documents of the top passages, in
order, each document once (a document's best passage places it). recall@k looks at the first
k documents of a search for max(k, 10) passages; MRR@10 and nDCG@10 at the first 10 (linear
gains, as trec_eval's ndcg_cut). Both at the collection's own knobs and at exact search.

The collection's keyword weight (`choose_hybrid`, `rag eval --choose-hybrid`): nDCG@10 at each
of a few `hybrid` weights, the best chosen on the even-numbered judged queries and kept only
when it does at least as well as dense search (weight 0) on the odd-numbered ones, which it was
not chosen on; `--apply` stores it in the collection's search defaults. (`rag tune` has no
judgements, so it cannot weigh keyword hits.)

Answer metrics (only with answers): token F1 of the generated answer against the reference
(SQuAD normalisation: lower case, no punctuation or articles), and citation precision: the
share of cited passages whose document is relevant to the query, over queries with at least
one citation. Answers come from an `AnswerFn`; `default_answer_fn` uses the service's ask path
(`rag.answer`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from rag.answer import AskRequest, Final, ask, collect
from rag.db import collections, documents
from rag.db.models import Collection
from rag.errors import Invalid, NotFound
from rag.knobs import Knobs
from rag.ops.judgements import Qrels
from rag.ops.judgements import read_answers as read_answers
from rag.ops.judgements import read_qrels as read_qrels
from rag.ops.judgements import read_queries as read_queries
from rag.ops.scoring import dedupe, mrr_at, ndcg_at, recall_at, token_f1
from rag.services import Services

log = logging.getLogger(__name__)

Progress = Callable[[Iterable[Any]], Iterable[Any]]


@dataclass(frozen=True)
class Answer:
    """What the ask path gave for one query: the text and the document ids it cited."""

    text: str
    cited_document_ids: list[str]


# (services, tenant_id, collection_id, question) -> Answer
AnswerFn = Callable[[Services, str, str, str], Answer]


# The keyword weights `choose_hybrid` compares (0: dense only).
HYBRID_WEIGHTS = (0.0, 0.05, 0.1, 0.15, 0.2, 0.3)


@dataclass
class HybridChoice:
    """nDCG@10 per keyword weight on each half of the judged queries, and the weight chosen."""

    ndcg: dict[float, tuple[float, float]]  # weight -> (even-numbered, odd-numbered queries)
    chosen: float
    applied: bool = False

    def table(self) -> str:
        lines = [f"{'hybrid':<10}{'ndcg@10 even':>14}{'ndcg@10 odd':>14}"]
        for weight, (even, odd) in self.ndcg.items():
            mark = "  <- chosen" + (", stored" if self.applied else "")
            lines.append(
                f"{weight:<10}{even:>14.4f}{odd:>14.4f}{mark if weight == self.chosen else ''}"
            )
        return "\n".join(lines)

    def as_dict(self) -> dict[str, Any]:
        return {
            "ndcg10": {str(w): {"even": e, "odd": o} for w, (e, o) in self.ndcg.items()},
            "chosen": self.chosen,
            "applied": self.applied,
        }


@dataclass
class Report:
    collection_id: str
    k: int
    queries: int
    retrieval: dict[str, dict[str, float]]  # setting ("collection", "exact") -> metric -> value
    answers: dict[str, float] | None = None
    notes: list[str] = field(default_factory=list)
    hybrid: HybridChoice | None = None
    # The answers again at candidate knobs (`evaluate(candidate=...)`), to compare.
    candidate_answers: dict[str, float] | None = None

    def table(self) -> str:
        names = [f"recall@{self.k}", "mrr@10", "ndcg@10"]
        lines = [
            f"collection {self.collection_id}, {self.queries} queries",
            "",
            f"{'setting':<12}" + "".join(f"{n:>12}" for n in names),
        ]
        for setting, values in self.retrieval.items():
            lines.append(f"{setting:<12}" + "".join(f"{values[n]:>12.4f}" for n in names))
        if self.answers:
            lines.append("")
            both = self.candidate_answers is not None
            if both:
                lines.append(f"{'answers':<24}{'collection':>10}{'candidate':>12}")
            for name, value in self.answers.items():
                counted = name in ("answered", "answers_with_citations")
                row = f"{name:<24}{int(value) if counted else f'{value:.4f}':>10}"
                if self.candidate_answers is not None:
                    other = self.candidate_answers.get(name, 0.0)
                    row += f"{int(other) if counted else f'{other:.4f}':>12}"
                lines.append(row)
        if self.hybrid is not None:
            lines += ["", self.hybrid.table()]
        lines.extend(f"note: {n}" for n in self.notes)
        return "\n".join(lines)

    def as_dict(self) -> dict[str, Any]:
        return {
            "collection_id": self.collection_id,
            "k": self.k,
            "queries": self.queries,
            "retrieval": self.retrieval,
            "answers": self.answers,
            "notes": self.notes,
            "hybrid": self.hybrid.as_dict() if self.hybrid is not None else None,
            "candidate_answers": self.candidate_answers,
        }


# ---------------------------------------------------------------- running it


def resolve_collection(
    services: Services, name_or_id: str, tenant: str | None = None
) -> Collection:
    """A live collection by id, or by name (then unique across tenants unless `tenant`, a
    tenant name, narrows it)."""
    with services.db.read() as session:
        if tenant is None:
            row = collections.find(session, name_or_id)
        else:
            row = collections.find_in_tenant_named(session, name_or_id, tenant)
    if row is None:
        raise NotFound(f"no collection {name_or_id!r} in {services.db.describe()}")
    return row


def corpus_ids(services: Services, collection_id: str) -> dict[str, set[str]]:
    """document id -> the corpus ids it answers to (metadata `_id`, else filename and stem)."""
    with services.db.read() as session:
        return documents.corpus_names(session, collection_id)


def _ranking(
    doc_ids: Iterable[str], names: dict[str, set[str]], relevant: dict[str, int]
) -> list[str]:
    """Document ids to corpus ids, in order, each once. A document with several names stands
    for the relevant one when it has one."""
    out = []
    for doc_id in dedupe(doc_ids):
        candidates = names.get(doc_id, {doc_id})
        hit = next((c for c in sorted(candidates) if relevant.get(c, 0) > 0), None)
        out.append(hit or min(candidates))
    return out


def evaluate(
    services: Services,
    collection: Collection,
    queries: dict[str, str],
    qrels: Qrels,
    *,
    k: int = 10,
    answers: dict[str, str] | None = None,
    answer_fn: AnswerFn | None = None,
    progress: Progress = lambda items: items,
    candidate: Knobs | None = None,
) -> Report:
    """`candidate`: search knobs to measure beside the collection's own (a change of
    settings, checked before it is applied): a "candidate" row, and answers at it."""
    judged = [qid for qid in queries if qid in qrels]
    notes = []
    if len(judged) < len(queries):
        notes.append(f"{len(queries) - len(judged)} queries have no judgements and were skipped")
    if not judged:
        raise Invalid("no query has a judgement in the qrels file")
    names = corpus_ids(services, collection.id)
    fetch = max(k, 10)
    settings = {"collection": Knobs(k=fetch), "exact": Knobs(k=fetch, exact=True)}
    if candidate is not None:
        settings["candidate"] = candidate.with_(k=fetch)
    sums = {s: {f"recall@{k}": 0.0, "mrr@10": 0.0, "ndcg@10": 0.0} for s in settings}
    for qid in progress(judged):
        relevant = qrels[qid]
        for setting, knobs in settings.items():
            result = services.retriever.search(
                collection.tenant_id, collection.id, queries[qid], knobs
            )
            ranking = _ranking((p.document_id for p in result.passages), names, relevant)
            sums[setting][f"recall@{k}"] += recall_at(ranking, relevant, k)
            sums[setting]["mrr@10"] += mrr_at(ranking, relevant, 10)
            sums[setting]["ndcg@10"] += ndcg_at(ranking, relevant, 10)
    retrieval = {s: {m: v / len(judged) for m, v in vals.items()} for s, vals in sums.items()}
    report = Report(collection.id, k, len(judged), retrieval, notes=notes)
    if answers:
        fn = answer_fn or default_answer_fn()
        report.answers = _answer_metrics(
            services, collection, queries, qrels, answers, names, fn, progress
        )
        if candidate is not None:
            other = default_answer_fn(candidate) if answer_fn is None else answer_fn
            report.candidate_answers = _answer_metrics(
                services, collection, queries, qrels, answers, names, other, progress
            )
    return report


def choose_hybrid(
    services: Services,
    collection: Collection,
    queries: dict[str, str],
    qrels: Qrels,
    *,
    weights: Sequence[float] = HYBRID_WEIGHTS,
    apply: bool = False,
    progress: Progress = lambda items: items,
) -> HybridChoice:
    """The keyword weight for this collection: the best nDCG@10 over the even-numbered judged
    queries (the smaller weight on a tie), kept when its nDCG@10 over the odd-numbered ones is
    at least dense search's (weight 0), else 0. Searches run at the collection's other knobs.
    With `apply`, the choice becomes the collection's default `hybrid`."""
    judged = [qid for qid in queries if qid in qrels]
    if len(judged) < 2:
        raise Invalid("choosing a hybrid weight needs at least two judged queries")
    weights = sorted({0.0, *weights})
    names = corpus_ids(services, collection.id)
    ndcg = {w: [0.0, 0.0] for w in weights}
    halves = [0, 0]
    for n, qid in enumerate(progress(judged)):
        half = n % 2
        halves[half] += 1
        for w in weights:
            result = services.retriever.search(
                collection.tenant_id, collection.id, queries[qid], Knobs(k=10, hybrid=w)
            )
            ranking = _ranking((p.document_id for p in result.passages), names, qrels[qid])
            ndcg[w][half] += ndcg_at(ranking, qrels[qid], 10)
    means = {w: (even / halves[0], odd / halves[1]) for w, (even, odd) in ndcg.items()}
    best = max(weights, key=lambda w: (means[w][0], -w))
    chosen = best if means[best][1] >= means[0.0][1] else 0.0
    choice = HybridChoice(means, chosen)
    if apply:
        with services.db.write() as session:
            row = collections.get_live(session, collection.id)
            if row is None:
                raise NotFound(f"collection {collection.id} not found")
            defaults = {**(row.search_defaults or {}), "hybrid": chosen}
            collections.set_search_defaults(session, row, defaults)
        choice.applied = True
        log.info("collection %s: hybrid %s stored as its default", collection.id, chosen)
    return choice


def _answer_metrics(
    services: Services,
    collection: Collection,
    queries: dict[str, str],
    qrels: Qrels,
    answers: dict[str, str],
    names: dict[str, set[str]],
    fn: AnswerFn,
    progress: Progress,
) -> dict[str, float]:
    asked = [qid for qid in queries if qid in answers]
    f1_sum, precision_sum, cited_queries = 0.0, 0.0, 0
    for qid in progress(asked):
        got = fn(services, collection.tenant_id, collection.id, queries[qid])
        f1_sum += token_f1(got.text, answers[qid])
        if got.cited_document_ids:
            relevant = qrels.get(qid, {})
            # One citation per cited passage: the same document cited twice counts twice.
            good = sum(
                1
                for doc_id in got.cited_document_ids
                if any(relevant.get(c, 0) > 0 for c in names.get(doc_id, {doc_id}))
            )
            precision_sum += good / len(got.cited_document_ids)
            cited_queries += 1
    return {
        "answer_token_f1": f1_sum / len(asked) if asked else 0.0,
        "citation_precision": precision_sum / cited_queries if cited_queries else 0.0,
        "answered": float(len(asked)),
        "answers_with_citations": float(cited_queries),
    }


def default_answer_fn(knobs: Knobs | None = None) -> AnswerFn:
    """The service's ask path (the code behind POST .../ask) at the collection's knobs (or
    `knobs` over them) and the default sampling settings."""
    loop = asyncio.new_event_loop()  # one loop for the whole run: the engine keeps state

    async def one(services: Services, tenant_id: str, collection_id: str, question: str) -> Final:
        req = AskRequest(question, knobs=knobs or Knobs())
        prep = await ask.prepare(services, tenant_id, collection_id, req)
        return await collect(services, prep)

    def run(services: Services, tenant_id: str, collection_id: str, question: str) -> Answer:
        final = loop.run_until_complete(one(services, tenant_id, collection_id, question))
        return Answer(final.answer, [c.document_id for c in final.citations])

    return run
