"""Quality you can watch: feedback on answers, a collection's quality series and drift, its
unanswered topics, and pinning the drift reference (rag.quality; README "Quality").

Every route is the tenant's own: another tenant's answer or collection is a 404, as is an
answer past the retention or one never recorded (quality.enabled off).
"""

from __future__ import annotations

import time
from typing import Annotated

from fastapi import Path, Query

from rag.api.body import Router
from rag.api.deps import CurrentPrincipal, PoolsDep, ServicesDep
from rag.api.openapi import AUTHENTICATED, WITH_BODY, errors
from rag.api.schemas import iso
from rag.api.schemas_quality import (
    Bucket,
    DriftOut,
    FeedbackIn,
    FeedbackOut,
    PinIn,
    PinOut,
    QualityOut,
    TopicOut,
    TopicsOut,
)
from rag.auth import Principal
from rag.db import answers as sql
from rag.db import collections, documents
from rag.db import drift as drift_sql
from rag.db.models import now
from rag.errors import Conflict, Invalid, NotFound
from rag.ops.metrics import observe_feedback
from rag.quality import Quality
from rag.quality.topics import topics
from rag.services import Services

router = Router(tags=["quality"], responses=AUTHENTICATED)

DAY_S = 86400.0
# Ids are letters, digits, "_" and "-": anything else (a NUL that PostgreSQL refuses in a
# text parameter) is a 422 before it reaches the database.
IdPath = Annotated[str, Path(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")]


def _quality(services: Services) -> Quality:
    if services.quality is None or not services.quality.enabled:
        raise NotFound("answers are not recorded here (quality.enabled is off)")
    return services.quality


@router.post(
    "/v1/answers/{answer_id}/feedback",
    response_model=FeedbackOut,
    responses={**WITH_BODY, **errors(404)},
)
async def feedback(
    answer_id: IdPath,
    body: FeedbackIn,
    services: ServicesDep,
    principal: CurrentPrincipal,
    pools: PoolsDep,
) -> FeedbackOut:
    """Rate an answer (up or down), with an optional comment and the right answer or
    document. One rating per answer and API key: a later one replaces it."""
    quality = _quality(services)
    # An answer just given may still be on its way to the database.
    await pools.db.run(quality.recorder.wait_written, answer_id, 2.0)
    out = await pools.db.run(_rate, services, principal, answer_id, body)
    observe_feedback(out[1], body.rating)
    return out[0]


def _rate(
    services: Services, principal: Principal, answer_id: str, body: FeedbackIn
) -> tuple[FeedbackOut, str]:
    retention = services.settings.quality.retention_days * DAY_S
    with services.db.write() as session:
        answer = sql.get(session, principal.tenant_id, answer_id, newer_than=now() - retention)
        if answer is None:
            raise NotFound(f"answer {answer_id} not found")
        if body.correct_document_id is not None:
            try:
                doc = documents.get(session, principal.tenant_id, body.correct_document_id)
            except NotFound:
                doc = None
            if doc is None or doc.collection_id != answer.collection_id:
                raise Invalid("correct_document_id: no such document in the answer's collection")
        before = [f for f in sql.rated_by(session, answer.id, principal.key_id)]
        row = sql.rate(
            session, answer, principal.key_id, body.rating, body.comment, body.correct_answer,
            body.correct_document_id,
        )  # fmt: skip
        out = FeedbackOut(
            answer_id=answer.id, rating=row.rating, comment=row.comment,
            correct_answer=row.correct_answer, correct_document_id=row.correct_document_id,
            created_at=iso(row.created_at), replaced=bool(before),
        )  # fmt: skip
        return out, answer.collection_id


@router.get(
    "/v1/collections/{collection_id}/quality", response_model=QualityOut, responses=errors(404)
)
async def quality(
    collection_id: IdPath,
    services: ServicesDep,
    principal: CurrentPrincipal,
    pools: PoolsDep,
    hours: Annotated[float, Query(gt=0, le=24 * 366, description="how far back")] = 24.0,
    buckets: Annotated[int, Query(ge=1, le=500, description="points in each series")] = 24,
) -> QualityOut:
    """The collection's answers over time: how they ended (answer_source, finish_reason),
    unsupported sentences, top passage score and gap, feedback, first-token and answer
    latency; and its drift (questions and content)."""
    _quality(services)
    return await pools.db.run(_series, services, principal.tenant_id, collection_id, hours, buckets)


def _series(
    services: Services, tenant_id: str, collection_id: str, hours: float, n: int
) -> QualityOut:
    width = hours * 3600.0 / n
    end = time.time()
    since = end - hours * 3600.0
    with services.db.read() as session:
        collections.get(session, tenant_id, collection_id)
        rows = sql.series(session, collection_id, since, width)
        ratings = sql.feedback_series(session, collection_id, since, width)
        states = [
            s for s in drift_sql.states(session, tenant_id) if s.collection_id == collection_id
        ]
    out = [
        Bucket(
            start=iso(since + i * width),
            answers=0,
            answer_source={},
            finish_reason={},
            unsupported=0,
            weak=0,
            top_score=None,
            score_gap=None,
            first_token_ms=None,
            latency_ms=None,
            feedback_up=0,
            feedback_down=0,
        )  # fmt: skip
        for i in range(n)
    ]
    means: dict[int, dict[str, tuple[float, int]]] = {}
    for r in rows:
        i = min(max(r["bucket"], 0), n - 1)
        b = out[i]
        b.answers += r["count"]
        b.answer_source[r["answer_source"]] = (
            b.answer_source.get(r["answer_source"], 0) + r["count"]
        )
        b.finish_reason[r["finish_reason"]] = (
            b.finish_reason.get(r["finish_reason"], 0) + r["count"]
        )
        b.unsupported += r["unsupported"]
        b.weak += r["weak"]
        acc = means.setdefault(i, {})
        for name in ("top_score", "score_gap", "first_token_ms", "latency_ms"):
            if r[name] is not None:
                total, count = acc.get(name, (0.0, 0))
                acc[name] = (total + float(r[name]) * r["count"], count + r["count"])
    for i, acc in means.items():
        for name, (total, count) in acc.items():
            setattr(out[i], name, round(total / count, 4) if count else None)
    for bucket, rating, count in ratings:
        i = min(max(bucket, 0), n - 1)
        if rating == "up":
            out[i].feedback_up += count
        else:
            out[i].feedback_down += count
    totals = {
        "answers": sum(b.answers for b in out),
        "refused": sum(b.answer_source.get("refused", 0) for b in out),
        "unsupported": sum(b.unsupported for b in out),
        "weak": sum(b.weak for b in out),
        "feedback_up": sum(b.feedback_up for b in out),
        "feedback_down": sum(b.feedback_down for b in out),
    }
    drift = [
        DriftOut(
            kind=s.kind,
            score=s.score,
            alert=s.alert,
            statistic=s.statistic,
            threshold=s.threshold,
            streak=s.streak,
            pinned=s.pinned,
            details=s.details or {},
            updated_at=iso(s.updated_at),
        )  # fmt: skip
        for s in states
    ]
    return QualityOut(
        collection_id=collection_id, since=iso(since), bucket_s=width, buckets=out,
        totals=totals, drift=drift, questions_stored=services.settings.quality.store_questions,
    )  # fmt: skip


@router.get(
    "/v1/collections/{collection_id}/unanswered", response_model=TopicsOut, responses=errors(404)
)
async def unanswered(
    collection_id: IdPath,
    services: ServicesDep,
    principal: CurrentPrincipal,
    pools: PoolsDep,
    days: Annotated[float, Query(gt=0, le=366, description="how far back")] = 7.0,
    limit: Annotated[int, Query(ge=1, le=100, description="topics shown")] = 10,
) -> TopicsOut:
    """Questions the collection refused or answered from weak evidence, clustered by
    meaning, the most missing evidence first (count times how far the best passages fall
    below quality.advanced.weak_score), with example questions and the documents they reached."""
    _quality(services)
    return await pools.search.run(
        _topics, services, principal.tenant_id, collection_id, days, limit
    )


def _topics(
    services: Services, tenant_id: str, collection_id: str, days: float, limit: int
) -> TopicsOut:
    cfg = services.settings.quality
    since = time.time() - days * DAY_S
    with services.db.read() as session:
        collections.get(session, tenant_id, collection_id)
        asked = sql.weak(session, collection_id, since, cfg.advanced.topics_max_questions)
        docs = sql.documents_of(session, [a.id for a in asked])
    found = topics(
        asked, docs, distance=cfg.advanced.topic_distance, weak_score=cfg.advanced.weak_score
    )[:limit]
    wanted = sorted({d for t in found for d in t.documents})
    with services.db.read() as session:
        names = documents.filenames(session, tenant_id, wanted)
    return TopicsOut(
        collection_id=collection_id,
        since=iso(since),
        questions=len(asked),
        topics=[
            TopicOut(
                count=t.count,
                refused=t.refused,
                examples=t.examples,
                documents=[{"id": d, "filename": names[d]} for d in t.documents if d in names],
                first_at=iso(t.first_at),
                last_at=iso(t.last_at),
            )  # fmt: skip
            for t in found
        ],
    )


@router.put(
    "/v1/collections/{collection_id}/drift/reference",
    response_model=PinOut,
    responses={**WITH_BODY, **errors(404, 409)},
)
async def pin_reference(
    collection_id: IdPath,
    body: PinIn,
    services: ServicesDep,
    principal: CurrentPrincipal,
    pools: PoolsDep,
) -> PinOut:
    """Pin the collection's latest questions as the reference its drift is measured from
    (after a change of documents made the old questions' shift expected)."""
    quality = _quality(services)
    n = body.last or services.settings.quality.drift.reference_size

    def pin() -> PinOut:
        with services.db.read() as session:
            collections.get(session, principal.tenant_id, collection_id)
            rows = sql.recent(session, collection_id, n)
        if len(rows) < 2:
            raise Conflict("the collection has fewer than two questions to pin")
        held = quality.watch.pin(collection_id, principal.tenant_id, rows)
        return PinOut(collection_id=collection_id, pinned=True, reference=held)

    return await pools.db.run(pin)


@router.delete(
    "/v1/collections/{collection_id}/drift/reference",
    response_model=PinOut,
    responses=errors(404),
)
async def unpin_reference(
    collection_id: IdPath,
    services: ServicesDep,
    principal: CurrentPrincipal,
    pools: PoolsDep,
) -> PinOut:
    """Back to the collection's first questions as the reference."""
    _quality(services)

    def unpin() -> PinOut:
        with services.db.write() as session:
            collections.get(session, principal.tenant_id, collection_id)
            drift_sql.set_reference(session, collection_id, [])
            drift_sql.pin(session, collection_id, principal.tenant_id, False)
        return PinOut(collection_id=collection_id, pinned=False, reference=0)

    return await pools.db.run(unpin)
