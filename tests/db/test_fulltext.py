"""Keyword search (rag.db.fulltext): a collection's scores depend on its own chunks only,
tombstoned and filtered-out chunks never come back, and no query text can make it fail."""

from __future__ import annotations

import pytest

from rag.db import Database, collections, documents, fulltext
from rag.db.purge import purge_collections, purge_documents
from tests.db.conftest import Make


def _search(db: Database, cid: str, query: str, limit: int = 10, **kw: object) -> dict[int, float]:
    with db.read() as s:
        return dict(fulltext.keyword_search(s, cid, query, limit, **kw))  # type: ignore[arg-type]


def test_terms_are_the_distinct_words_without_stopwords() -> None:
    assert fulltext.terms("What is the Apple's apple PIE?") == ["apple", "s", "pie"]
    assert fulltext.terms("what is the") == ["what", "is", "the"]  # all stopwords: kept
    assert fulltext.terms('"" OR * NEAR( -') == ["near"]
    assert len(fulltext.terms(" ".join(f"w{i}" for i in range(100)))) == fulltext.MAX_TERMS


def test_a_collections_scores_do_not_move_when_another_tenant_ingests(
    db: Database, make: Make
) -> None:
    mine = make.collection(make.tenant())
    pie = make.indexed(mine, ["apple pie with cinnamon"]).chunk_ids[0]
    make.indexed(mine, ["banana bread"])
    before = _search(db, mine, "apple cinnamon")
    assert list(before) == [pie] and before[pie] > 0

    theirs = make.collection(make.tenant())
    their_ids = set()
    for i in range(5):
        their_ids.update(make.indexed(theirs, [f"apple apple cinnamon {i} " * 3]).chunk_ids)
    after = _search(db, mine, "apple cinnamon")
    assert after.keys() == before.keys()
    assert after[pie] == pytest.approx(before[pie], rel=1e-9)
    assert set(_search(db, theirs, "apple")) == their_ids  # and none of mine


def test_best_first_without_tombstoned_or_filtered_out_chunks(db: Database, make: Make) -> None:
    tenant, cid = make.tenant_and_collection()
    strong = make.indexed(cid, ["solar panel solar panel efficiency"]).chunk_ids[0]
    weak = make.indexed(cid, ["a long passage that mentions solar once among many other words"])
    gone = make.indexed(cid, ["solar solar solar panel"])
    with db.write() as s:
        documents.delete(s, tenant, gone.document_id)

    with db.read() as s:
        ranked = fulltext.keyword_search(s, cid, "solar panel", 10)
    assert [i for i, _ in ranked] == [strong, weak.chunk_ids[0]]
    assert ranked[0][1] > ranked[1][1]
    assert list(_search(db, cid, "solar", allowed_ids={weak.chunk_ids[0]})) == weak.chunk_ids
    assert _search(db, cid, "solar", allowed_ids=set()) == {}
    assert list(_search(db, cid, "solar panel", limit=1)) == [strong]
    assert _search(db, cid, "solar", limit=0) == {}
    assert _search(db, cid, "unrelated") == {}
    assert _search(db, make.collection(tenant), "solar") == {}  # nothing ingested there yet


def test_query_syntax_is_read_as_words(db: Database, make: Make) -> None:
    cid = make.collection(make.tenant())
    hit = make.indexed(cid, ["solar panel"]).chunk_ids[0]
    for query in ['"solar', "solar*", "NEAR(solar panel)", "solar AND OR NOT", "solar:*&|!"]:
        assert set(_search(db, cid, query)) == {hit}, query
    for query in ["(:*&|!)", "'; --", "AND OR NOT"]:
        assert _search(db, cid, query) == {}, query


def test_a_purged_documents_words_leave_the_scores(db: Database, make: Make) -> None:
    tenant = make.tenant()
    cid, fresh = make.collection(tenant), make.collection(tenant)
    kept = make.indexed(cid, ["apple pie"]).chunk_ids[0]
    purged = make.indexed(cid, ["apple apple apple tart with a long list of other words"])
    alone = make.indexed(fresh, ["apple pie"]).chunk_ids[0]
    with db.write() as s:
        documents.delete(s, tenant, purged.document_id)
    purge_documents(db, 10)
    assert _search(db, cid, "apple")[kept] == pytest.approx(_search(db, fresh, "apple")[alone])

    with db.write() as s:
        collections.delete(s, tenant, cid)
    purge_documents(db, 10)
    purge_collections(db)
    with db.read() as s:
        assert fulltext.tables(s) == ([f"chunks_fts_{fresh}"] if db.is_sqlite else [])
    assert _search(db, cid, "apple") == {}
