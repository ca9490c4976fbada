"""Per-tenant quotas (collections, documents, bytes: 403) and the pending-jobs limit (429),
through the real app on SQLite and PostgreSQL. Unlimited by default."""

from __future__ import annotations

from collections.abc import Callable

from sqlalchemy import func, select

from rag.db.models import Collection, Document, IngestJob
from rag.embed import HashEmbedder
from tests.conftest import Api


def _quota(make_api: Callable[..., Api], db_url: str, **quota: object) -> Api:
    return make_api(db_url, HashEmbedder(384), sections={"quota": quota})


def _upload(api: Api, headers: dict[str, str], cid: str, *texts: str) -> object:
    return api.client.post(
        f"/v1/collections/{cid}/documents",
        json={"documents": [{"text": t} for t in texts]},
        headers=headers,
    )


def test_no_quota_by_default(api: Api) -> None:
    settings = api.services.settings.quota
    assert settings.model_dump() == {
        "max_collections": None,
        "max_documents": None,
        "max_storage_mb": None,
        "max_pending_jobs": None,
        "max_concurrent_asks": None,
        "max_conversations": None,
        "max_conversation_mb": None,
    }
    for i in range(5):
        api.collection(api.a, name=f"c{i}")


def test_collections_quota(make_api: Callable[..., Api], db_url: str) -> None:
    api = _quota(make_api, db_url, max_collections=2)
    first = api.collection(api.a, name="one")
    api.collection(api.a, name="two")
    r = api.client.post("/v1/collections", json={"name": "three"}, headers=api.a)
    assert r.status_code == 403, r.text
    error = r.json()["error"]
    assert error["code"] == "quota_exceeded" and "at most 2 collections" in error["message"]
    assert error["detail"] == {"quota": "collections", "limit": 2, "used": 2}
    with api.services.db.read() as s:  # the refused row was rolled back
        assert s.scalar(select(func.count()).select_from(Collection)) == 2
    api.collection(api.b, name="three")  # another tenant's quota is its own
    assert api.client.delete(f"/v1/collections/{first}", headers=api.a).status_code == 204
    api.collection(api.a, name="three")  # a deleted collection no longer counts


def test_documents_quota_refuses_the_whole_upload(
    make_api: Callable[..., Api], db_url: str
) -> None:
    api = _quota(make_api, db_url, max_documents=2)
    cid = api.collection(api.a)
    r = _upload(api, api.a, cid, "one", "two", "three")
    assert r.status_code == 403, r.text  # type: ignore[attr-defined]
    assert r.json()["error"]["detail"]["quota"] == "documents"  # type: ignore[attr-defined]
    with api.services.db.read() as s:
        assert s.scalar(select(func.count()).select_from(Document)) == 0
        assert s.scalar(select(func.count()).select_from(IngestJob)) == 0
    assert _upload(api, api.a, cid, "one", "two").status_code == 202  # type: ignore[attr-defined]
    # The same bytes again are the document already there: nothing new to count.
    assert _upload(api, api.a, cid, "one").status_code == 202  # type: ignore[attr-defined]
    assert _upload(api, api.a, cid, "four").status_code == 403  # type: ignore[attr-defined]
    other = api.collection(api.b)
    assert _upload(api, api.b, other, "four").status_code == 202  # type: ignore[attr-defined]


def test_storage_quota(make_api: Callable[..., Api], db_url: str) -> None:
    api = _quota(make_api, db_url, max_storage_mb=0.001)  # 1048 bytes
    cid = api.collection(api.a)
    assert _upload(api, api.a, cid, "x" * 1000).status_code == 202  # type: ignore[attr-defined]
    r = _upload(api, api.a, cid, "y" * 100)
    assert r.status_code == 403  # type: ignore[attr-defined]
    error = r.json()["error"]  # type: ignore[attr-defined]
    assert error["detail"] == {"quota": "storage_bytes", "limit": 1048, "used": 1100}
    assert "1048" in error["message"]


def test_pending_jobs_limit_is_429_until_the_queue_drains(
    make_api: Callable[..., Api], db_url: str
) -> None:
    api = make_api(
        db_url,
        HashEmbedder(384),
        in_process_worker=False,
        sections={"quota": {"max_pending_jobs": 2}},
    )
    cid = api.collection(api.a)
    assert _upload(api, api.a, cid, "one", "two").status_code == 202  # type: ignore[attr-defined]
    r = _upload(api, api.a, cid, "three")
    assert r.status_code == 429, r.text  # type: ignore[attr-defined]
    assert r.headers["Retry-After"] == "5"  # type: ignore[attr-defined]
    assert r.json()["error"]["code"] == "overloaded"  # type: ignore[attr-defined]
    other = api.collection(api.b)
    assert _upload(api, api.b, other, "three").status_code == 202  # type: ignore[attr-defined]
    from ingest.worker import Worker
    from rag.services import make_worker

    worker: Worker = make_worker(api.services)
    while worker.run_once():
        pass
    assert _upload(api, api.a, cid, "three").status_code == 202  # type: ignore[attr-defined]
