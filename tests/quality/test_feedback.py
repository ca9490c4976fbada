"""Answer records and feedback through the real app (SQLite and PostgreSQL): every answer has
an id and is recorded off its path; a rating per answer and key; 404 for what the caller may
not see; 4xx JSON for bad input; the recording never fails or slows an answer."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy import func, select, update

from rag.db.models import Answer, AnswerDocument, Feedback
from tests.answer.conftest import parse_sse
from tests.conftest import Api
from tests.quality.conftest import ASK, FACTS, flush, ingest, quality_api


def _ask(api: Api, cid: str, headers: dict[str, str] | None = None, **body: Any) -> Any:
    r = api.client.post(
        f"/v1/collections/{cid}/ask",
        json={**ASK, **body},
        headers=api.a if headers is None else headers,
    )
    assert r.status_code == 200, r.text
    return r


def _rate(api: Api, answer_id: str, headers: dict[str, str] | None = None, **body: Any) -> Any:
    body.setdefault("rating", "up")
    return api.client.post(
        f"/v1/answers/{answer_id}/feedback",
        json=body,
        headers=api.a if headers is None else headers,
    )


def test_every_answer_has_an_id_and_is_recorded_with_what_made_it(qapi: Api) -> None:
    cid = qapi.collection(qapi.a)
    docs = ingest(qapi, qapi.a, cid, FACTS)
    plain = _ask(qapi, cid).json()
    streamed = parse_sse(_ask(qapi, cid, stream=True).text)[-1][1]
    chat = qapi.client.post(
        "/v1/chat/completions",
        json={"model": cid, "messages": [{"role": "user", "content": ASK["question"]}]},
        headers=qapi.a,
    ).json()
    ids = [plain["answer_id"], streamed["answer_id"], chat["ragserve"]["answer_id"]]
    assert all(i and i.startswith("ans_") for i in ids) and len(set(ids)) == 3
    flush(qapi)
    with qapi.services.db.read() as s:
        rows = {a.id: a for a in s.scalars(select(Answer))}
        links = s.execute(select(AnswerDocument.answer_id, AnswerDocument.document_id)).all()
    assert set(rows) == set(ids)
    row = rows[plain["answer_id"]]
    assert row.question == ASK["question"] and row.answer == plain["answer"]
    assert row.collection_id == cid and row.answer_source == plain["answer_source"]
    assert row.finish_reason == plain["finish_reason"] == "stop"
    assert len(row.chunk_ids) == len(plain["passages"]) == 2
    assert row.settings["knobs"]["k"] == 2 and row.settings["evidence"] == "all"
    assert row.top_score is not None and row.score_gap is not None and row.score_gap >= 0
    assert row.latency_ms > 0 and row.question_embedding is not None
    assert len(row.question_embedding) == 384 * 4
    assert {d for a, d in links if a == row.id} <= set(docs)


def test_feedback_one_per_answer_and_key_a_later_one_replaces_it(qapi: Api) -> None:
    cid = qapi.collection(qapi.a)
    docs = ingest(qapi, qapi.a, cid, FACTS)
    answer_id = _ask(qapi, cid).json()["answer_id"]
    # No flush: a rating right after the answer waits for its record.
    first = _rate(qapi, answer_id, comment="spot on")
    assert first.status_code == 200, first.text
    assert first.json()["rating"] == "up" and first.json()["replaced"] is False
    second = _rate(qapi, answer_id, rating="down", correct_answer="At ten.",
                   correct_document_id=docs[0])  # fmt: skip
    assert second.status_code == 200, second.text
    got = second.json()
    assert got["replaced"] is True and got["comment"] is None
    assert got["correct_answer"] == "At ten." and got["correct_document_id"] == docs[0]
    key_b, _ = __import__("rag.auth", fromlist=["create_key"]).create_key(
        qapi.services.db, "tenant-a"
    )
    other_key = {"Authorization": f"Bearer {key_b}"}
    assert _rate(qapi, answer_id, headers=other_key).status_code == 200
    with qapi.services.db.read() as s:
        ratings = sorted(s.scalars(select(Feedback.rating)))
    assert ratings == ["down", "up"]  # one per key


def test_what_the_caller_may_not_rate_is_404_and_bad_input_422(qapi: Api) -> None:
    cid = qapi.collection(qapi.a)
    ingest(qapi, qapi.a, cid, FACTS)
    answer_id = _ask(qapi, cid).json()["answer_id"]
    other_cid = qapi.collection(qapi.a, name="other")
    other_doc = ingest(qapi, qapi.a, other_cid, ["Unrelated text about owls at night."])[0]
    for bad_id in ["ans_" + "0" * 32, "x" * 64]:
        r = _rate(qapi, bad_id)
        assert r.status_code == 404 and r.json()["error"]["code"] == "not_found", r.text
    for bad_id in ["%00", "a%20b", "x" * 65]:
        r = _rate(qapi, bad_id)
        assert r.status_code == 422 and r.json()["error"]["code"] == "invalid", r.text
    r = _rate(qapi, answer_id, headers=qapi.b)  # another tenant
    assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"
    problems = [
        {"rating": "meh"},
        {"rating": 1},
        {"rating": "up", "comment": "x" * 2001},
        {"rating": "up", "correct_answer": ""},
        {"rating": "up", "correct_answer": "a" * 4001},
        {"rating": "up", "extra": True},
        {"rating": "up", "correct_document_id": other_doc},  # another collection's
        {"rating": "up", "correct_document_id": "nope"},
    ]
    for body in problems:
        r = qapi.client.post(f"/v1/answers/{answer_id}/feedback", json=body, headers=qapi.a)
        assert r.status_code == 422, (body, r.text)
        assert r.json()["error"]["code"] == "invalid"
    r = qapi.client.post(f"/v1/answers/{answer_id}/feedback", content=b"{not json", headers=qapi.a)
    assert r.status_code == 422
    assert _rate(qapi, answer_id, headers={}).status_code == 401
    assert _rate(qapi, answer_id, comment="x" * 2000).status_code == 200


def test_an_expired_answer_is_404_and_the_purge_erases_it(
    make_api: Callable[..., Api], db_url: str, hash_embedder: Any
) -> None:
    api = quality_api(make_api, db_url, hash_embedder, retention_days=1.0)
    cid = api.collection(api.a)
    ingest(api, api.a, cid, FACTS)
    old, new = (_ask(api, cid).json()["answer_id"] for _ in range(2))
    flush(api)
    assert _rate(api, old).status_code == 200
    with api.services.db.write() as s:
        s.execute(update(Answer).where(Answer.id == old).values(created_at=time.time() - 2 * 86400))
    assert _rate(api, old).status_code == 404
    api.services.purger.run_once()
    with api.services.db.read() as s:
        assert set(s.scalars(select(Answer.id))) == {new}
        assert s.scalar(select(func.count()).select_from(Feedback)) == 0


def test_question_text_is_not_stored_when_turned_off(
    make_api: Callable[..., Api], db_url: str, hash_embedder: Any
) -> None:
    api = quality_api(make_api, db_url, hash_embedder, store_questions=False)
    cid = api.collection(api.a)
    ingest(api, api.a, cid, FACTS)
    _ask(api, cid)
    flush(api)
    with api.services.db.read() as s:
        row = s.scalars(select(Answer)).one()
    assert row.question is None and row.question_embedding is not None


def test_quality_off_gives_no_id_and_refuses_feedback(
    make_api: Callable[..., Api], sqlite_url: str, hash_embedder: Any
) -> None:
    api = quality_api(make_api, sqlite_url, hash_embedder, enabled=False)
    cid = api.collection(api.a)
    ingest(api, api.a, cid, FACTS)
    assert _ask(api, cid).json()["answer_id"] is None
    r = _rate(api, "ans_" + "1" * 32)
    assert r.status_code == 404 and "quality.enabled" in r.json()["error"]["message"]


def test_the_recording_never_fails_or_slows_an_answer(
    make_api: Callable[..., Api], sqlite_url: str, hash_embedder: Any
) -> None:
    """A writer that hangs, then one that fails, then a full queue: every answer is given at
    once, and the records lost are counted."""
    api = quality_api(make_api, sqlite_url, hash_embedder, advanced={"queue": 2, "batch": 1})
    quality = api.services.quality
    assert quality is not None
    cid = api.collection(api.a)
    ingest(api, api.a, cid, FACTS)
    _ask(api, cid)  # warm
    flush(api)
    stuck = __import__("threading").Event()

    def hang(batch: list[Any]) -> None:
        stuck.wait(10)
        raise RuntimeError("the database went away")

    quality.recorder._write = hang
    t0 = time.perf_counter()
    for _ in range(6):  # one held by the writer, two queued, the rest dropped
        assert _ask(api, cid).json()["answer"]
    took = time.perf_counter() - t0
    assert took < 5, took
    assert quality.recorder.dropped >= 3
    stuck.set()
    quality.recorder.flush()
    assert quality.recorder.dropped == 6
    metrics = api.client.get(
        "/metrics", headers={"Authorization": "Bearer test-admin-key-0123456789"}
    )
    assert "rag_quality_records_dropped_total 6.0" in metrics.text


def test_answers_within_the_writers_interval_share_one_transaction(
    make_api: Callable[..., Api], sqlite_url: str, hash_embedder: Any
) -> None:
    """The writer waits `flush_s` after the first record it takes: answers given meanwhile
    are written together, not one transaction each, and every one is written."""
    api = quality_api(make_api, sqlite_url, hash_embedder, advanced={"flush_s": 5.0})
    quality = api.services.quality
    assert quality is not None
    cid = api.collection(api.a)
    ingest(api, api.a, cid, FACTS)
    batches: list[int] = []
    write = quality.recorder._write

    def counted(batch: list[Any]) -> None:
        batches.append(len(batch))
        write(batch)

    quality.recorder._write = counted
    ids = [_ask(api, cid).json()["answer_id"] for _ in range(5)]
    quality.recorder.wait_written(ids[-1], timeout_s=30)
    assert batches == [5]
    with api.services.db.read() as s:
        assert s.scalar(select(func.count()).where(Answer.id.in_(ids))) == 5


@pytest.mark.parametrize("stream", [False, True])
def test_a_record_that_cannot_be_built_is_dropped_not_the_answer(
    make_api: Callable[..., Api], sqlite_url: str, hash_embedder: Any, stream: bool,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    import rag.quality as quality_module

    api = quality_api(make_api, sqlite_url, hash_embedder)
    cid = api.collection(api.a)
    ingest(api, api.a, cid, FACTS)

    def broken(*_: Any, **__: Any) -> Any:
        raise ValueError("a bug in the record")

    monkeypatch.setattr(quality_module, "build", broken)
    r = _ask(api, cid, stream=stream)
    final = parse_sse(r.text)[-1][1] if stream else r.json()
    assert final["answer"] and final["finish_reason"] == "stop"
