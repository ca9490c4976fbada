"""The API with a collection of index kind milvus, through the real app on SQLite and
PostgreSQL, against `milvus-lite server`: upload → search → delete → search, filters, rebuild,
and two API replicas on one database sharing one Milvus."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from rag.api.app import create_app
from rag.config import Settings
from rag.db import milvus_collections as bindings
from rag.embed import Embedder
from rag.index.milvus import MilvusEngine
from rag.services import build_services
from tests.conftest import Api
from tests.support.milvus import milvus_uri  # noqa: F401  (fixture)

FACTS = [
    "The ferry to the island leaves from pier four at nine every morning.",
    "Lighthouse keepers trim the wick and polish the lens each evening.",
    "Tide tables for the harbour are printed monthly by the harbour office.",
    "The fish market opens before dawn and closes at noon on Sundays.",
    "Storm warnings are broadcast on marine radio channel sixteen.",
    "The museum of maritime history has a collection of ship models.",
]
MILVUS = {"index": {"kind": "milvus"}}


@pytest.fixture
def prefix() -> str:
    return f"api{uuid.uuid4().hex[:10]}"


@pytest.fixture
def replica(
    tmp_path: Path,
    db_url: str,
    hash_embedder: Embedder,
    milvus_uri: str,  # noqa: F811
    prefix: str,
    request: pytest.FixtureRequest,
) -> Iterator[Callable[..., Api]]:
    """A factory of API replicas: each its own app, services and data dir, all on one
    database and one Milvus."""
    clients: list[TestClient] = []

    def make(*, worker: bool = True) -> Api:
        settings = Settings(
            data_dir=tmp_path / f"replica{len(clients)}",
            database={"url": db_url},
            ingest={
                "in_process_worker": worker,
                "advanced": {"backoff_base_s": 0.05, "poll_interval_s": 0.05, "lease_s": 5.0},
            },
            auth={"admin_key": "test-admin-key-0123456789"},
            milvus={"uri": milvus_uri, "collection_prefix": prefix},
        )
        services = build_services(settings, embedder=hash_embedder)
        client = TestClient(create_app(settings, services))
        client.__enter__()
        clients.append(client)
        # Closed before the database fixture's teardown (a PostgreSQL schema must outlive
        # the workers polling it).
        request.node.addfinalizer(lambda: client.__exit__(None, None, None))
        return Api(client, services)

    yield make


def milvus_names(uri: str, prefix: str) -> list[str]:
    from rag.config import MilvusSettings

    engine = MilvusEngine(MilvusSettings(uri=uri, collection_prefix=prefix))
    try:
        return engine.names()
    finally:
        engine.close()


def ingest(api: Api, headers: dict[str, str], cid: str, texts: list[str]) -> list[str]:
    docs = []
    for i, text in enumerate(texts):
        meta = {"n": i, "kind": "even" if i % 2 == 0 else "odd"}
        item = api.upload_text(headers, cid, text, metadata=meta)
        assert api.wait_job(headers, item["job_id"])["state"] == "done"
        docs.append(item["document_id"])
    return docs


def search(api: Api, headers: dict[str, str], cid: str, **body: object) -> dict:
    r = api.client.post(f"/v1/collections/{cid}/search", json=body, headers=headers)
    assert r.status_code == 200, r.text
    return r.json()  # type: ignore[no-any-return]


def found(out: dict) -> list[str]:
    return [p["document_id"] for p in out["passages"]]


def test_upload_search_delete_rebuild(
    replica: Callable[..., Api],
    milvus_uri: str,  # noqa: F811
    prefix: str,
) -> None:
    api = replica()
    cid = api.collection(api.a, **MILVUS)
    docs = ingest(api, api.a, cid, FACTS)
    out = search(api, api.a, cid, query=FACTS[0], k=3)
    assert found(out)[0] == docs[0]
    assert out["index"]["kind"] == "milvus" and out["knobs"]["index_kind"] == "milvus"
    assert out["knobs"]["ef_search"] >= 3  # HNSW in Milvus: the knob is reported as used

    # Filters evaluated inside Milvus: metadata, document ids, and both.
    out = search(api, api.a, cid, query=FACTS[0], k=6, filter={"metadata": {"kind": "odd"}})
    assert set(found(out)) == {docs[1], docs[3], docs[5]}
    out = search(api, api.a, cid, query=FACTS[0], filter={"document_ids": [docs[2], docs[4]]})
    assert set(found(out)) == {docs[2], docs[4]}
    out = search(
        api, api.a, cid, query="x", filter={"document_ids": [docs[2]], "metadata": {"n": 2}}
    )
    assert found(out) == [docs[2]]
    r = api.client.post(
        f"/v1/collections/{cid}/search",
        json={"query": "x", "filter": {"metadata": {"nope": 1}}},
        headers=api.a,
    )
    assert r.status_code == 422, r.text
    # A filter with a value that does not map into an expression is applied after.
    out = search(api, api.a, cid, query="x", k=6, filter={"metadata": {"kind": 'od"d'}})
    assert found(out) == []
    # Hybrid with a filter: ids resolved in SQL, for both sides.
    out = search(api, api.a, cid, query="ferry", k=6, hybrid=0.5, filter={"metadata": {"n": 0}})
    assert found(out) == [docs[0]]

    # Another tenant sees nothing of it.
    r = api.client.post(f"/v1/collections/{cid}/search", json={"query": "x"}, headers=api.b)
    assert r.status_code == 404

    # Deleted: gone from the next search, whichever way it is asked.
    assert api.client.delete(f"/v1/documents/{docs[0]}", headers=api.a).status_code == 204
    for body in ({"k": 6}, {"k": 6, "hybrid": 0.5}, {"k": 6, "exact": True}):
        assert docs[0] not in found(search(api, api.a, cid, query=FACTS[0], **body))

    # Rebuild from SQL into a new Milvus collection (IVF this time), swapped in by name.
    with api.services.db.read() as session:
        before = bindings.get(session, cid)
    assert before is not None and before.name in milvus_names(milvus_uri, prefix)
    r = api.client.post(
        f"/v1/collections/{cid}/index/rebuild",
        json={"kind": "milvus", "params": {"index_type": "IVF_FLAT", "nlist": 2}},
        headers=api.a,
    )
    assert r.status_code == 202, r.text
    api.services.indexes._builds[cid].result(timeout=120)
    with api.services.db.read() as session:
        after = bindings.get(session, cid)
    assert after is not None and after.name != before.name
    assert milvus_names(milvus_uri, prefix) == [after.name]
    out = search(api, api.a, cid, query=FACTS[1], k=6)
    assert found(out)[0] == docs[1] and docs[0] not in found(out)
    assert out["knobs"]["nprobe"] is not None and out["index"]["count"] == 5

    # The collection deleted: its Milvus collection goes with it.
    assert api.client.delete(f"/v1/collections/{cid}", headers=api.a).status_code == 204
    api.services.indexes.sweep_shared()
    assert milvus_names(milvus_uri, prefix) == []


def test_two_replicas_share_one_milvus(
    replica: Callable[..., Api],
    milvus_uri: str,  # noqa: F811
    prefix: str,
) -> None:
    a = replica(worker=True)
    b = replica(worker=False)  # serves searches only
    cid = a.collection(a.a, **MILVUS)
    docs = ingest(a, a.a, cid, FACTS[:3])
    # Searchable on the other replica as soon as ingest committed.
    assert found(search(b, b.a, cid, query=FACTS[2], k=1)) == [docs[2]]
    assert found(search(a, a.a, cid, query=FACTS[2], k=1)) == [docs[2]]
    # One Milvus collection for both.
    assert len(milvus_names(milvus_uri, prefix)) == 1
    assert a.services.indexes.get(cid).name == b.services.indexes.get(cid).name  # type: ignore[attr-defined]

    # Uploaded through a, deleted through b: both replicas stop returning it at once.
    more = ingest(a, a.a, cid, FACTS[3:])
    assert found(search(b, b.a, cid, query=FACTS[4], k=1)) == [more[1]]
    assert b.client.delete(f"/v1/documents/{more[1]}", headers=b.a).status_code == 204
    for api in (a, b):
        assert more[1] not in found(search(api, api.a, cid, query=FACTS[4], k=6))

    # Rebuilt through b: a follows the swap on its next search.
    r = b.client.post(f"/v1/collections/{cid}/index/rebuild", json={}, headers=b.a)
    assert r.status_code == 202, r.text
    b.services.indexes._builds[cid].result(timeout=120)
    names = milvus_names(milvus_uri, prefix)
    assert len(names) == 1 and names[0] == b.services.indexes.get(cid).name  # type: ignore[attr-defined]
    out = search(a, a.a, cid, query=FACTS[5], k=6)
    assert found(out)[0] == more[2] and more[1] not in found(out)
    assert a.services.indexes.get(cid).name == names[0]  # type: ignore[attr-defined]
    with a.services.db.read() as session:
        bound = bindings.get(session, cid)
    assert bound is not None and bound.building is None


def test_kind_milvus_needs_a_configured_server(
    make_api: Callable[..., Api], sqlite_url, hash_embedder
) -> None:  # type: ignore[no-untyped-def]
    api = make_api(sqlite_url, hash_embedder)
    # Refused as the collection is made (or rebuilt into milvus), not at its first search.
    r = api.client.post("/v1/collections", json={"name": "m", **MILVUS}, headers=api.a)
    assert r.status_code == 422 and "RAG_MILVUS__URI" in r.text
    cid = api.collection(api.a)
    r = api.client.post(
        f"/v1/collections/{cid}/index/rebuild", json={"kind": "milvus"}, headers=api.a
    )
    assert r.status_code == 422 and "RAG_MILVUS__URI" in r.text
