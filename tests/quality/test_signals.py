"""Quality signals, drift and unanswered topics from recorded answers (SQLite and
PostgreSQL): the series route, /metrics, the drift loop's state in SQL (every replica agrees),
pinning the reference, and topics with and without question text. Answers are written by the
recording code itself (rag.db.answers.insert, as the writer does) with embeddings drawn
around chosen centres, so what should drift and what should not is known."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from rag.db import answers as sql
from rag.db.answers import NewAnswer
from rag.quality.drift import mmd_test
from rag.quality.watch import Watch
from tests.conftest import ADMIN, Api
from tests.quality.conftest import ASK, FACTS, flush, ingest, quality_api

DIM = 384
TEST = {"check_every": 20, "permutations": 200}
SMALL = {"reference_size": 40, "window": 40, "advanced": TEST}


def _unit(x: np.ndarray) -> np.ndarray:
    return (x / np.linalg.norm(x, axis=-1, keepdims=True)).astype(np.float32)


def _around(centre: np.ndarray, n: int, rng: np.random.Generator, spread: float = 0.6) -> Any:
    return _unit(centre + spread * rng.normal(size=(n, DIM)) / np.sqrt(DIM) * 4)


def _write(
    api: Api, cid: str, vectors: np.ndarray, *, questions: list[str] | None = None,
    refused: bool = False, docs: list[str] = (), start: float | None = None,
) -> list[str]:  # fmt: skip
    tenant = _tenant(api, cid)
    t0 = start if start is not None else time.time()
    rows = [
        NewAnswer(
            id=f"ans_{cid[:8]}{i:06d}{np.random.randint(1 << 30):09d}",
            tenant_id=tenant,
            collection_id=cid,
            created_at=t0 + i * 1e-3,
            question=questions[i] if questions else None,
            question_embedding=v.astype("<f4").tobytes(),
            answer="",
            chunk_ids=[],
            document_ids=list(docs),
            settings={},
            answer_source="refused" if refused else "quoted",
            finish_reason="no_evidence" if refused else "stop",
            mode="generate",
            top_score=0.1 if refused else 0.6,
            score_gap=0.05,
            unsupported=0,
            first_token_ms=5.0,
            latency_ms=20.0,
            weak=refused,
        )  # fmt: skip
        for i, v in enumerate(vectors)
    ]
    with api.services.db.write() as s:
        assert sql.insert(s, rows) == len(rows)
    return [r.id for r in rows]


def _tenant(api: Api, cid: str) -> str:
    from rag.db.models import Collection

    with api.services.db.read() as s:
        row = s.get(Collection, cid)
        assert row is not None
        return row.tenant_id


def _watch(api: Api) -> Watch:
    assert api.services.quality is not None
    return api.services.quality.watch


def test_the_mmd_test_separates_shifted_samples_and_not_equal_ones() -> None:
    rng = np.random.default_rng(1)
    a, b = rng.normal(size=(2, DIM)), rng.normal(size=(2, DIM))
    same = [mmd_test(_around(a[0], 60, rng), _around(a[0], 60, rng), seed=s) for s in range(20)]
    assert sum(t.exceeded for t in same) <= 2  # alpha 0.01 over 20 tests
    shifted = mmd_test(_around(a[0], 60, rng), _around(b[0], 60, rng), seed=0)
    assert shifted.exceeded and shifted.score > 1 and shifted.p_value < 0.01
    again = mmd_test(_around(a[0], 5, np.random.default_rng(3)),
                     _around(a[0], 5, np.random.default_rng(4)), seed=7)  # fmt: skip
    assert again == mmd_test(_around(a[0], 5, np.random.default_rng(3)),
                             _around(a[0], 5, np.random.default_rng(4)), seed=7)  # fmt: skip
    with pytest.raises(ValueError):
        mmd_test(a[:1], b)


def test_question_drift_alerts_in_sql_and_metrics_and_every_replica_agrees(
    make_api: Callable[..., Api], db_url: str, hash_embedder: Any
) -> None:
    api = quality_api(
        make_api, db_url, hash_embedder, drift={**SMALL, "advanced": {**TEST, "consecutive": 2}}
    )
    cid = api.collection(api.a)
    rng = np.random.default_rng(0)
    old, new = rng.normal(size=(2, DIM))
    t = time.time() - 100
    _write(api, cid, _around(old, 80, rng), start=t)
    watch = _watch(api)
    checked = watch.check_questions(cid, _tenant(api, cid))
    assert checked.tested and not checked.alert  # the reference, and a window like it
    # Another process (a replica) on the same database: it has nothing left to test.
    from rag.db import Database

    replica = Watch(Database(api.services.db.url.render_as_string(hide_password=False)),
                    api.services.settings.quality)  # fmt: skip
    assert not replica.check_questions(cid, _tenant(api, cid)).tested
    _write(api, cid, _around(new, 20, rng), start=t + 10)
    first = watch.check_questions(cid, _tenant(api, cid))
    assert first.tested and first.test is not None and first.test.exceeded and not first.alert
    _write(api, cid, _around(new, 20, rng), start=t + 20)
    second = replica.check_questions(cid, _tenant(api, cid))  # the replica's turn
    assert second.tested and second.alert
    replica.db.dispose()
    r = api.client.get(f"/v1/collections/{cid}/quality", headers=api.a)
    assert r.status_code == 200, r.text
    (drift,) = r.json()["drift"]
    assert drift["kind"] == "questions" and drift["alert"] and drift["score"] > 1
    assert drift["streak"] == 2 and drift["details"]["reference"] == 40
    metrics = api.client.get("/metrics", headers=ADMIN).text
    assert f'rag_drift_alert{{collection="{cid}",kind="questions"}} 1.0' in metrics
    assert f'rag_drift_score{{collection="{cid}",kind="questions"}}' in metrics
    # Pinning the recent questions as the reference ends the alert.
    r = api.client.put(f"/v1/collections/{cid}/drift/reference", json={"last": 40}, headers=api.a)
    assert r.status_code == 200 and r.json() == {"collection_id": cid, "pinned": True,
                                                 "reference": 40}  # fmt: skip
    _write(api, cid, _around(new, 40, rng), start=t + 30)
    after = watch.check_questions(cid, _tenant(api, cid))
    assert after.tested and not after.alert
    assert api.client.put(f"/v1/collections/{cid}/drift/reference", json={"last": 5},
                          headers=api.a).status_code == 422  # fmt: skip
    assert api.client.put(f"/v1/collections/{cid}/drift/reference", json={},
                          headers=api.b).status_code == 404  # fmt: skip
    r = api.client.delete(f"/v1/collections/{cid}/drift/reference", headers=api.a)
    assert r.status_code == 200 and r.json()["pinned"] is False


def test_a_stationary_stream_never_alerts(
    make_api: Callable[..., Api], sqlite_url: str, hash_embedder: Any
) -> None:
    api = quality_api(make_api, sqlite_url, hash_embedder, drift={**SMALL})
    cid = api.collection(api.a)
    rng = np.random.default_rng(5)
    centres = rng.normal(size=(3, DIM))
    t = time.time() - 1000
    alerts = 0
    for step in range(12):
        mix = centres[rng.integers(0, 3, size=20)]
        _write(api, cid, _unit(mix + 0.8 * rng.normal(size=(20, DIM))), start=t + step)
        alerts += _watch(api).check_questions(cid, _tenant(api, cid)).alert
    assert alerts == 0


def test_content_drift_alerts_on_an_upload_from_elsewhere(
    make_api: Callable[..., Api], sqlite_url: str, hash_embedder: Any
) -> None:
    """Documents about tides and harbours, then more of them (no alert), then documents
    of other words altogether (alert). The hash embedder's vectors are bags of words."""
    api = quality_api(make_api, sqlite_url, hash_embedder, drift={"content_min_new": 5})
    cid = api.collection(api.a)
    harbour = "tide harbour boat pier ferry anchor sail rope dock wave".split()
    other = "violin sonata orchestra chord melody tempo rhythm opera choir piano".split()
    rng = np.random.default_rng(2)

    def upload(words: list[str], n: int) -> None:
        texts = [" ".join(rng.choice(words, size=30)) + f" doc{i}" for i in range(n)]
        ingest(api, api.a, cid, texts)

    watch = _watch(api)

    def check() -> Any:
        from rag.db import drift as drift_sql

        with api.services.db.read() as s:
            newest = drift_sql.indexed_since(s)[cid][0]
        return watch.check_content(cid, _tenant(api, cid), newest)

    upload(harbour, 12)
    assert check().note == "the first documents"
    upload(harbour, 6)
    same = check()
    assert same.tested and not same.alert
    upload(other, 6)
    moved = check()
    assert moved.tested and moved.alert
    r = api.client.get(f"/v1/collections/{cid}/quality", headers=api.a).json()
    assert {d["kind"]: d["alert"] for d in r["drift"]} == {"content": True}


def test_the_quality_series_and_metrics_count_what_answers_did(qapi: Api) -> None:
    cid = qapi.collection(qapi.a)
    ingest(qapi, qapi.a, cid, FACTS)
    got = [qapi.client.post(f"/v1/collections/{cid}/ask", json=ASK, headers=qapi.a).json()
           for _ in range(3)]  # fmt: skip
    flush(qapi)
    qapi.client.post(f"/v1/answers/{got[0]['answer_id']}/feedback", json={"rating": "up"},
                     headers=qapi.a)  # fmt: skip
    qapi.client.post(f"/v1/answers/{got[1]['answer_id']}/feedback", json={"rating": "down"},
                     headers=qapi.a)  # fmt: skip
    r = qapi.client.get(f"/v1/collections/{cid}/quality", params={"hours": 1, "buckets": 6},
                        headers=qapi.a)  # fmt: skip
    assert r.status_code == 200, r.text
    body = r.json()
    assert len(body["buckets"]) == 6 and body["questions_stored"] is True
    assert body["totals"] == {"answers": 3, "refused": 0, "unsupported": 0, "weak": body[
        "totals"]["weak"], "feedback_up": 1, "feedback_down": 1}  # fmt: skip
    last = body["buckets"][-1]
    assert last["answers"] == 3 and last["finish_reason"] == {"stop": 3}
    assert last["latency_ms"] > 0 and last["top_score"] is not None
    metrics = qapi.client.get("/metrics", headers=ADMIN).text
    label = f'collection="{cid}"'
    assert f'rag_answers_total{{answer_source="generated",{label},finish_reason="stop"}} 3.0' in (
        metrics
    ) or f'rag_answers_total{{{label},answer_source="generated",finish_reason="stop"}} 3.0' in (
        metrics
    )
    assert f'rag_feedback_total{{{label},rating="up"}} 1.0' in metrics
    assert f'rag_answer_latency_seconds_count{{{label},stage="answer"}} 3.0' in metrics
    # Another tenant's collection, or a bad query, is never a 500.
    assert qapi.client.get(f"/v1/collections/{cid}/quality", headers=qapi.b).status_code == 404
    for params in ({"hours": 0}, {"buckets": 0}, {"buckets": 501}, {"hours": "x"}):
        r = qapi.client.get(f"/v1/collections/{cid}/quality", params=params, headers=qapi.a)
        assert r.status_code == 422, (params, r.text)


@pytest.mark.parametrize("store", [True, False])
def test_unanswered_topics_cluster_refused_questions_biggest_first(
    make_api: Callable[..., Api], db_url: str, hash_embedder: Any, store: bool
) -> None:
    # Centres drawn at random are about orthogonal; a tighter cut than the default keeps
    # the strays of this small set apart.
    api = quality_api(
        make_api, db_url, hash_embedder, store_questions=store, advanced={"topic_distance": 0.8}
    )
    cid = api.collection(api.a)
    docs = ingest(api, api.a, cid, FACTS)
    rng = np.random.default_rng(4)
    leave, parking, scatter = rng.normal(size=(3, DIM))
    asked = [f"How many weeks of parental leave, case {i}?" for i in range(24)]
    _write(api, cid, _around(leave, 24, rng, 0.3), questions=asked if store else None,
           refused=True, docs=[docs[0]])  # fmt: skip
    _write(api, cid, _around(parking, 8, rng, 0.3), refused=True, docs=[docs[1]])
    _write(api, cid, _unit(rng.normal(size=(6, DIM))), refused=True)
    _write(api, cid, _around(scatter, 30, rng, 0.3))  # answered well: not unanswered
    r = api.client.get(f"/v1/collections/{cid}/unanswered", headers=api.a)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["questions"] == 38
    top, second = body["topics"][:2]
    assert top["count"] == 24 and top["refused"] == 24 and second["count"] == 8
    assert top["documents"] == [{"id": docs[0], "filename": "doc0.txt"}]
    if store:
        assert len(top["examples"]) == 5 and all("parental leave" in q for q in top["examples"])
    else:
        assert top["examples"] == []
    assert api.client.get(f"/v1/collections/{cid}/unanswered", headers=api.b).status_code == 404
    for params in ({"days": 0}, {"limit": 0}, {"limit": 101}):
        r = api.client.get(f"/v1/collections/{cid}/unanswered", params=params, headers=api.a)
        assert r.status_code == 422
