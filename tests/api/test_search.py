"""POST /v1/collections/{id}/search through the real app, on SQLite and PostgreSQL."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest
from sqlalchemy import text as sql

from tests.conftest import Api

FACTS = [
    "The ferry to the island leaves from pier four at nine every morning.",
    "Lighthouse keepers trim the wick and polish the lens each evening.",
    "Tide tables for the harbour are printed monthly by the harbour office.",
    "The fish market opens before dawn and closes at noon on Sundays.",
    "Storm warnings are broadcast on marine radio channel sixteen.",
    "The museum of maritime history has a collection of ship models.",
]


def _ingest(
    api: Api, headers: dict[str, str], cid: str, texts: list[str], **extra: object
) -> list[str]:
    docs = []
    for i, text in enumerate(texts):
        meta = {"n": i, "kind": "even" if i % 2 == 0 else "odd"}
        item = api.upload_text(headers, cid, text, metadata=meta, **extra)
        assert api.wait_job(headers, item["job_id"])["state"] == "done"
        docs.append(item["document_id"])
    return docs


def _search(api: Api, headers: dict[str, str], cid: str, **body: object) -> dict:
    r = api.client.post(f"/v1/collections/{cid}/search", json=body, headers=headers)
    assert r.status_code == 200, r.text
    return r.json()  # type: ignore[no-any-return]


@pytest.mark.slow
def test_search_finds_the_right_passage_with_the_real_model(
    make_api: Callable[..., Api],
    db_url: str,
    minilm,  # type: ignore[no-untyped-def]
) -> None:
    api = make_api(db_url, minilm)
    cid = api.collection(api.a)
    docs = _ingest(api, api.a, cid, FACTS)
    out = _search(api, api.a, cid, query="When does the boat to the island depart?", k=3)
    assert out["passages"][0]["document_id"] == docs[0]
    assert out["passages"][0]["text"] == FACTS[0]
    assert len(out["passages"]) == 3
    assert out["passages"][0]["score"] >= out["passages"][1]["score"]
    assert out["knobs"]["k"] == 3 and out["knobs"]["index_kind"]
    assert {"embed", "search", "hydrate", "fuse"} <= set(out["timings_ms"])
    assert out["degraded"] is False and out["partial"] is False
    # Hybrid: the keyword side ranks the exact rare word too.
    out = _search(api, api.a, cid, query="channel sixteen", hybrid=0.5, k=2)
    assert out["passages"][0]["document_id"] == docs[4]
    assert out["knobs"]["hybrid"] == 0.5 and "keyword" in out["timings_ms"]


def test_fewer_chunks_than_k_returns_what_there_is(api: Api) -> None:
    cid = api.collection(api.a)
    _ingest(api, api.a, cid, FACTS[:2])
    out = _search(api, api.a, cid, query="ferry", k=50)
    assert len(out["passages"]) == 2
    empty = api.collection(api.a, name="empty")
    assert _search(api, api.a, empty, query="ferry")["passages"] == []


def test_deleted_documents_are_never_returned(api: Api) -> None:
    cid = api.collection(api.a)
    docs = _ingest(api, api.a, cid, FACTS)
    assert docs[0] in {
        p["document_id"] for p in _search(api, api.a, cid, query="ferry", k=6)["passages"]
    }
    assert api.client.delete(f"/v1/documents/{docs[0]}", headers=api.a).status_code == 204
    out = _search(api, api.a, cid, query="ferry pier four", k=6, hybrid=0.5)
    assert docs[0] not in {p["document_id"] for p in out["passages"]}
    assert len(out["passages"]) == 5


def test_deleted_documents_never_returned_under_concurrent_search(sqlite_api: Api) -> None:
    api = sqlite_api
    cid = api.collection(api.a)
    texts = [f"{FACTS[i % len(FACTS)]} Copy number {i}." for i in range(24)]
    docs = _ingest(api, api.a, cid, texts)
    deleted: set[str] = set()
    lock = threading.Lock()
    errors: list[str] = []
    stop = threading.Event()

    def searcher() -> None:
        while not stop.is_set():
            with lock:
                gone = set(deleted)  # deleted before this search started
            out = api.client.post(
                f"/v1/collections/{cid}/search",
                headers=api.a,
                json={"query": "harbour ferry lighthouse", "k": 24},
            )
            found = {p["document_id"] for p in out.json()["passages"]}
            if found & gone:
                errors.append(f"deleted documents returned: {found & gone}")

    threads = [threading.Thread(target=searcher) for _ in range(3)]
    for t in threads:
        t.start()
    for doc in docs[:12]:
        assert api.client.delete(f"/v1/documents/{doc}", headers=api.a).status_code == 204
        with lock:
            deleted.add(doc)
    stop.set()
    for t in threads:
        t.join()
    assert errors == []
    out = _search(api, api.a, cid, query="harbour", k=24)
    assert {p["document_id"] for p in out["passages"]} == set(docs[12:])


def test_tenants_with_near_duplicate_documents_never_see_each_other(api: Api) -> None:
    ca = api.collection(api.a)
    cb = api.collection(api.b)
    docs_a = _ingest(api, api.a, ca, [f"{t} (tenant a)" for t in FACTS])
    docs_b = _ingest(api, api.b, cb, [f"{t} (tenant b)" for t in FACTS])
    for headers, cid, own in ((api.a, ca, set(docs_a)), (api.b, cb, set(docs_b))):
        out = _search(api, headers, cid, query="ferry pier harbour tide", k=20, hybrid=0.3)
        assert {p["document_id"] for p in out["passages"]} <= own
        assert len(out["passages"]) == len(FACTS)
    # The other tenant's collection is not found at all.
    r = api.client.post(f"/v1/collections/{ca}/search", json={"query": "ferry"}, headers=api.b)
    assert r.status_code == 404


def test_filters_are_applied_inside_the_search(api: Api) -> None:
    cid = api.collection(api.a)
    docs = _ingest(api, api.a, cid, FACTS)
    out = _search(api, api.a, cid, query="ferry", k=3, filter={"metadata": {"kind": "odd"}})
    assert len(out["passages"]) == 3
    assert all(p["metadata"]["kind"] == "odd" for p in out["passages"])
    out = _search(api, api.a, cid, query="ferry", k=10, filter={"document_ids": [docs[2], docs[3]]})
    assert {p["document_id"] for p in out["passages"]} == {docs[2], docs[3]}
    out = _search(api, api.a, cid, query="ferry", filter={"metadata": {"n": 4}})
    assert [p["document_id"] for p in out["passages"]] == [docs[4]]


@pytest.mark.parametrize(
    "body",
    [
        {"query": ""},
        {"query": "   "},
        {"query": "x", "k": 0},
        {"query": "x", "k": 5000},
        {"query": "x", "k": 300},
        {"query": "x", "k": 20, "ef_search": 10},
        {"query": "x", "hybrid": 2},
        {"query": "x", "surprise": 1},
        {"query": "x", "filter": {"metadata": {"unknown_key": "v"}}},
        {"query": "x", "filter": {"colour": "red"}},
        {"query": "x" * 5000},
    ],
)
def test_bad_search_input_is_422(sqlite_api: Api, body: dict) -> None:
    api = sqlite_api
    cid = api.collection(api.a)
    _ingest(api, api.a, cid, FACTS[:1])
    r = api.client.post(f"/v1/collections/{cid}/search", json=body, headers=api.a)
    assert r.status_code == 422, r.text
    assert r.json()["error"]["message"]


def test_budget_degradation_is_reported(sqlite_api: Api) -> None:
    api = sqlite_api
    cid = api.collection(api.a, index={"kind": "hnsw", "params": {}})
    _ingest(api, api.a, cid, FACTS)
    out = _search(api, api.a, cid, query="ferry", k=2, ef_search=400, hybrid=0.5, budget_ms=0.01)
    assert out["degraded"] is True
    assert any("ef_search lowered from 400" in d for d in out["degradations"])
    assert any("keyword search skipped" in d for d in out["degradations"])
    assert out["knobs"]["ef_search"] < 400 and out["knobs"]["hybrid"] == 0
    assert out["over_budget"] is True
    assert len(out["passages"]) == 2  # degraded, not empty
    relaxed = _search(api, api.a, cid, query="ferry", k=2, ef_search=400, budget_ms=60_000)
    assert relaxed["degraded"] is False and relaxed["knobs"]["ef_search"] == 400


def test_collection_search_defaults_and_rebuild_into_another_kind(sqlite_api: Api) -> None:
    api = sqlite_api
    cid = api.collection(api.a)
    _ingest(api, api.a, cid, FACTS)
    r = api.client.put(f"/v1/collections/{cid}/search-defaults", json={"k": 2}, headers=api.a)
    assert r.status_code == 200 and r.json()["search_defaults"] == {"k": 2}
    assert len(_search(api, api.a, cid, query="ferry")["passages"]) == 2
    r = api.client.post(
        f"/v1/collections/{cid}/index/rebuild", json={"kind": "hnsw"}, headers=api.a
    )
    assert r.status_code == 202, r.text
    import time

    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        out = _search(api, api.a, cid, query="ferry", k=6)
        if out["knobs"]["index_kind"] == "hnsw":
            break
        time.sleep(0.1)
    assert out["knobs"]["index_kind"] == "hnsw" and len(out["passages"]) == 6
    r = api.client.post(
        f"/v1/collections/{cid}/index/rebuild", json={"kind": "nope"}, headers=api.a
    )
    assert r.status_code == 422


def test_keyword_side_ignores_stopwords(api: Api) -> None:
    """A question's filler words ("when", "the", "is") match nearly every passage; only the
    words that say what is meant reach the full-text engine."""
    from rag.db.fulltext import keyword_search, terms

    assert terms("When is the Ferry to the island?") == ["ferry", "island"]
    assert terms("to be or not to be") == ["to", "be", "or", "not"]  # nothing else to go on
    cid = api.collection(api.a)
    docs = _ingest(api, api.a, cid, FACTS)
    with api.services.db.read() as session:
        hits = keyword_search(session, cid, "when is the ferry to the island", 10)
    # Every fact has "the", "to", "of" or "at"; only the first mentions the ferry.
    assert len(hits) == 1
    with api.services.db.read() as session:
        chunk_doc = session.execute(
            sql("SELECT document_id FROM chunks WHERE id = :id"), {"id": hits[0][0]}
        ).scalar_one()
    assert chunk_doc == docs[0]


def test_keyword_scores_do_not_move_when_another_tenant_ingests(api: Api) -> None:
    """BM25's statistics (document count, lengths, how many documents hold a word) are the
    collection's own: another tenant ingesting the same words changes nothing a tenant sees.
    (One shared FTS5 table made bm25() a signal of what other tenants hold.)"""
    ca = api.collection(api.a)
    _ingest(api, api.a, ca, FACTS)
    query = {"query": "ferry harbour lighthouse radio", "k": 6, "hybrid": 0.5, "exact": True}

    def scores() -> list[tuple[str, float | None, float]]:
        out = _search(api, api.a, ca, **query)
        return [(p["chunk_id"], p["keyword_score"], p["score"]) for p in out["passages"]]

    before = scores()
    assert any(kw for _, kw, _ in before)
    cb = api.collection(api.b)
    _ingest(api, api.b, cb, ["ferry " * 30, "harbour harbour lighthouse", "radio " + FACTS[0]])
    other = api.collection(api.a, name="other")  # the tenant's other collection, too
    _ingest(api, api.a, other, ["lighthouse radio ferry"] * 3)
    assert scores() == before


def test_metadata_filters_compare_by_type_and_never_fail(api: Api) -> None:
    """A filter means the same on SQLite, PostgreSQL and inside Milvus (rag.index.milvus
    .filters.matches): a boolean is not a number, 3 equals 3.0, a value of another type
    than the document's simply does not match (PostgreSQL cast the text: a 500), and a key is
    one key (a `"` broke SQLite's JSON path: a 500, or a path into nested objects)."""
    cid = api.collection(api.a)
    metas = [
        {"flag": True, "n": 1, "x": "1", "q": 1},
        {"flag": 1, "n": 3.0, "x": "abc"},
        {"flag": "true", "n": "3", "x": 2.5, 'q"uote': "yes", "q.b": 2},
    ]
    docs = []
    for i, meta in enumerate(metas):
        item = api.upload_text(api.a, cid, f"{FACTS[i]} ({i})", metadata=meta)
        assert api.wait_job(api.a, item["job_id"])["state"] == "done"
        docs.append(item["document_id"])

    def found(**metadata: object) -> set[int]:
        r = api.client.post(
            f"/v1/collections/{cid}/search",
            json={"query": "ferry lighthouse", "k": 10, "filter": {"metadata": metadata}},
            headers=api.a,
        )
        assert r.status_code == 200, r.text
        return {docs.index(p["document_id"]) for p in r.json()["passages"]}

    assert found(flag=True) == {0}
    assert found(flag=1) == {1}
    assert found(flag="true") == {2}
    assert found(n=3) == {1} and found(n=3.0) == {1} and found(n="3") == {2}
    assert found(x=1) == set() and found(x="abc") == {1} and found(x=2.5) == {2}
    assert found(**{'q"uote': "yes"}) == {2} and found(**{"q.b": 2}) == {2}
    for key in ('q"."b', 'q"'):
        r = api.client.post(
            f"/v1/collections/{cid}/search",
            json={"query": "ferry", "filter": {"metadata": {key: 1}}},
            headers=api.a,
        )
        assert r.status_code == 422 and "metadata key" in r.text, (key, r.text)


def test_clients_see_opaque_chunk_ids_and_admins_alone_the_watermark(api: Api) -> None:
    """Chunk ids and the index watermark were global counters: a tenant reading them between
    two of its own uploads saw how much every other tenant ingested and deleted meanwhile
    (issue 31, item 9). Clients now get each chunk's opaque id (a hash of its document and
    span, the same in search, answers and the chunk listing), and the watermark only with
    an admin key."""
    from sqlalchemy import select

    from rag.db.models import Chunk
    from tests.conftest import ADMIN

    cid = api.collection(api.a)
    item = api.upload_text(api.a, cid, "The ferry leaves from pier four at nine.")
    api.wait_job(api.a, item["job_id"])
    out = api.client.post(
        f"/v1/collections/{cid}/search", json={"query": "ferry"}, headers=api.a
    ).json()
    (passage,) = out["passages"]
    with api.services.db.read() as s:
        chunk = s.scalar(select(Chunk).where(Chunk.document_id == item["document_id"]))
    assert chunk is not None
    assert passage["chunk_id"] == chunk.uid != str(chunk.id)
    listed = api.client.get(f"/v1/documents/{item['document_id']}/chunks", headers=api.a)
    assert [c["id"] for c in listed.json()["chunks"]] == [chunk.uid]
    assert out["index"]["watermark"] is None
    rebuilt = api.client.post(f"/v1/collections/{cid}/index/rebuild", json={}, headers=api.a)
    assert rebuilt.status_code == 202 and rebuilt.json()["watermark"] is None
    mine = api.collection(ADMIN, name="admin's")
    item = api.upload_text(ADMIN, mine, "The ferry leaves from pier four at nine.")
    api.wait_job(ADMIN, item["job_id"])
    r = api.client.post(f"/v1/collections/{mine}/search", json={"query": "ferry"}, headers=ADMIN)
    assert r.json()["index"]["watermark"] >= 1
