"""Delete means gone: after the purge, a deleted document's rows, blob, full-text entries and
vectors are out of SQL, out of the index in memory and out of every file the service wrote
(SQLite's rag.db, -wal, -shm and the index snapshots), searched byte by byte."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from sqlalchemy import func, select, text

from rag.db import fulltext
from rag.db.models import Blob, ChangeLog, Chunk, Collection, Document, IngestJob
from rag.embed import HashEmbedder
from rag.purge import Removed
from tests.conftest import Api
from tests.support.leftovers import (
    document_needles,
    leftover_bytes,
    scan,
    vector_needles,
    word_needles,
)

# Words no other document has, that the stemmer leaves whole.
SECRET = ["quokkazanzibarqz", "xylothermicvortqz"]
KEPT = ["harbourlanternqz"]
# The loops' own rounds would race the test's: it runs them itself.
MANUAL = {"purge": {"interval_s": 3600.0}}


def _doc_text(words: list[str], n: int = 40) -> str:
    return " ".join(f"{words[i % len(words)]} filler{i} words about tides" for i in range(n))


def _indexed(api: Api, headers: dict[str, str], cid: str, words: list[str]) -> str:
    item = api.upload_text(headers, cid, _doc_text(words))
    assert api.wait_job(headers, item["job_id"])["state"] == "done"
    return str(item["document_id"])


def _purge(api: Api) -> None:
    """One purge round as the background loops run it: SQL and files, then the indexes."""
    for _ in range(20):  # a reader may hold the WAL for a moment: the round reports it
        if api.services.purger.run_once().reclaimed:
            break
        time.sleep(0.1)
    else:
        raise AssertionError("the WAL was never free to truncate")
    api.services.indexes.purge()


def _rows_of(api: Api, doc: str) -> dict[str, int]:
    with api.services.db.read() as s:

        def count(model: type, *where: object) -> int:
            return int(s.scalar(select(func.count()).select_from(model).where(*where)) or 0)

        return {
            "documents": count(Document, Document.id == doc),
            "chunks": count(Chunk, Chunk.document_id == doc),
            "jobs": count(IngestJob, IngestJob.document_id == doc),
            "adds": count(ChangeLog, ChangeLog.document_id == doc, ChangeLog.op == "add"),
            "removes": count(ChangeLog, ChangeLog.document_id == doc, ChangeLog.op == "remove"),
        }


@pytest.mark.parametrize("kind", ["hnsw", "faiss_hnsw", "faiss_flat"])
def test_deleted_document_leaves_no_bytes_in_any_file(
    make_api: Callable[..., Api], sqlite_url: str, kind: str
) -> None:
    api = make_api(sqlite_url, HashEmbedder(384), sections=MANUAL)
    data_dir = _files(api)  # the database's files too
    cid = api.collection(api.a, index={"kind": kind})
    doomed = _indexed(api, api.a, cid, SECRET)
    kept = _indexed(api, api.a, cid, KEPT)
    search = {"query": SECRET[0], "k": 5, "hybrid": 0.5}
    hits = api.client.post(f"/v1/collections/{cid}/search", json=search, headers=api.a).json()
    assert doomed in {h["document_id"] for h in hits["passages"]}
    api.services.indexes.snapshot(cid)  # a generation on disk that holds its vectors
    needles = document_needles(api.services.db, doomed, SECRET)
    kept_needles = document_needles(api.services.db, kept, KEPT)
    assert leftover_bytes(scan(data_dir, needles)) > 0  # the search below means something

    assert api.client.delete(f"/v1/documents/{doomed}", headers=api.a).status_code == 204
    _purge(api)

    found = scan(data_dir, needles)
    assert found == [], [(f.path.name, f.needle[:12], f.count) for f in found]
    assert leftover_bytes(scan(data_dir, kept_needles)) > 0  # the other document is intact
    rows = _rows_of(api, doomed)
    assert rows["removes"] > 0  # what other processes tail to drop their copies
    assert {k: v for k, v in rows.items() if k != "removes"} == {
        "documents": 0,
        "chunks": 0,
        "jobs": 0,
        "adds": 0,
    }
    with api.services.db.read() as s:
        blobs = s.scalar(select(func.count()).select_from(Blob))
        fts = sum(
            s.execute(
                text(f"SELECT count(*) FROM {t} WHERE {t} MATCH :q"), {"q": SECRET[0]}
            ).scalar_one()
            for t in fulltext.tables(s)
        )
    assert blobs == 1 and fts == 0
    index = api.services.indexes.get(cid)
    with api.services.db.read() as s:
        kept_ids = set(s.scalars(select(Chunk.id).where(Chunk.document_id == kept)))
    assert set(index.ids().tolist()) == kept_ids
    hits = api.client.post(f"/v1/collections/{cid}/search", json=search, headers=api.a).json()
    assert doomed not in {h["document_id"] for h in hits["passages"]}
    query = {"query": KEPT[0], "k": 1}
    hits = api.client.post(f"/v1/collections/{cid}/search", json=query, headers=api.a).json()
    assert hits["passages"][0]["document_id"] == kept


def test_deleted_collection_is_erased_and_its_index_dropped_quietly(
    make_api: Callable[..., Api], sqlite_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The in-memory index of a deleted collection used to stay, and its maintenance logged
    a traceback every 5 s; its snapshots stayed on disk."""
    api = make_api(sqlite_url, HashEmbedder(384), sections=MANUAL)
    data_dir = api.services.settings.data_dir
    cid = api.collection(api.a)
    docs = [_indexed(api, api.a, cid, [SECRET[i]]) for i in range(2)]
    api.client.post(f"/v1/collections/{cid}/search", json={"query": "tides"}, headers=api.a)
    api.services.indexes.snapshot(cid)
    needles = [n for d in docs for n in document_needles(api.services.db, d, SECRET)]
    assert (data_dir / "indexes" / cid).is_dir()
    caplog.set_level(logging.ERROR, logger="rag.index")

    assert api.client.delete(f"/v1/collections/{cid}", headers=api.a).status_code == 204
    maintainer = api.services.indexes._maintainer
    assert maintainer is not None
    api.services.indexes.open_collections()
    for _live_id, live in api.services.indexes.lives():
        live.spec_checked_at = 0.0  # the kind is re-read on the next tick, not in 5 s
    maintainer.tick()
    assert cid not in api.services.indexes.open_collections()
    assert not caplog.records, [r.getMessage() for r in caplog.records]
    assert not (data_dir / "indexes" / cid).exists()

    removed: list[Removed] = []
    api.services.purger.subscribe(removed.extend)
    _purge(api)
    assert scan(data_dir, needles) == []
    with api.services.db.read() as s:
        assert s.get(Collection, cid) is None
        assert s.scalar(select(func.count()).select_from(Chunk)) == 0
        assert s.scalar(select(func.count()).select_from(Blob)) == 0
    # Every process hears which chunks went, with their documents.
    assert {r.document_id for r in removed} == set(docs)
    assert all(r.collection_id == cid and r.chunk_ids for r in removed)


def test_purge_listeners_hear_of_a_document_delete(api: Api) -> None:
    cid = api.collection(api.a)
    doc = _indexed(api, api.a, cid, SECRET)
    with api.services.db.read() as s:
        chunk_ids = tuple(sorted(s.scalars(select(Chunk.id).where(Chunk.document_id == doc))))
    heard: list[Removed] = []
    api.services.purger.subscribe(heard.extend)
    api.client.delete(f"/v1/documents/{doc}", headers=api.a)
    api.services.purger.run_once()
    assert heard == [Removed(cid, doc, chunk_ids)]
    api.services.purger.run_once()
    assert len(heard) == 1  # told once


def test_purge_deletes_rows_and_vacuums(api: Api) -> None:
    """On PostgreSQL too: the rows go, and the tables are vacuumed."""
    cid = api.collection(api.a)
    doc = _indexed(api, api.a, cid, SECRET)
    api.client.delete(f"/v1/documents/{doc}", headers=api.a)
    _purge(api)
    rows = _rows_of(api, doc)
    assert rows["documents"] == rows["chunks"] == rows["jobs"] == rows["adds"] == 0
    db = api.services.db
    if db.dialect == "postgresql":
        with db.engine.connect() as conn:
            vacuumed = conn.execute(
                text(
                    "SELECT count(*) FROM pg_stat_user_tables WHERE relname IN "
                    "('chunks', 'documents', 'blobs') AND schemaname = current_schema() "
                    "AND last_vacuum IS NOT NULL"
                )
            ).scalar()
        assert vacuumed == 3


def test_a_blob_stays_while_its_tenant_still_uses_it(api: Api) -> None:
    """Blobs are per tenant: two tenants' uploads of the same bytes are two copies, and a
    purge drops a copy only when no document of its tenant uses it."""
    same = _doc_text(SECRET)
    a1, a2 = api.collection(api.a, name="one"), api.collection(api.a, name="two")
    b1 = api.collection(api.b)
    first = api.upload_text(api.a, a1, same)
    api.upload_text(api.a, a2, same)
    api.upload_text(api.b, b1, same)
    with api.services.db.read() as s:
        tenants = s.scalars(select(Blob.tenant_id)).all()
    assert len(tenants) == len(set(tenants)) == 2
    api.client.delete(f"/v1/documents/{first['document_id']}", headers=api.a)
    _purge(api)
    with api.services.db.read() as s:
        assert s.scalar(select(func.count()).select_from(Blob)) == 2  # a2 still uses A's
    api.client.delete(f"/v1/collections/{a2}", headers=api.a)
    _purge(api)
    with api.services.db.read() as s:
        owners = s.scalars(select(Blob.tenant_id)).all()
        b_tenant = s.scalar(select(Document.tenant_id).where(Document.collection_id == b1))
    assert owners == [b_tenant]


def test_the_loops_purge_on_their_own_within_the_interval(
    make_api: Callable[..., Api], sqlite_url: str
) -> None:
    api = make_api(sqlite_url, HashEmbedder(384), sections={"purge": {"interval_s": 0.2}})
    data_dir = api.services.settings.data_dir
    cid = api.collection(api.a, index={"kind": "hnsw"})
    doc = _indexed(api, api.a, cid, SECRET)
    api.client.post(f"/v1/collections/{cid}/search", json={"query": "tides"}, headers=api.a)
    api.services.indexes.snapshot(cid)
    needles = document_needles(api.services.db, doc, SECRET)
    api.client.delete(f"/v1/documents/{doc}", headers=api.a)
    deadline = time.monotonic() + 30
    while (left := leftover_bytes(scan(data_dir, needles))) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert left == 0


def test_an_old_sqlite_database_is_converted_to_give_pages_back(
    make_api: Callable[..., Api], tmp_path: Path
) -> None:
    """A database made before the purge (auto_vacuum off) is rewritten once by the first
    purge, and gives free pages back from then on."""
    import sqlite3

    path = tmp_path / "old.db"
    sqlite3.connect(path).execute("CREATE TABLE made_before (x)").connection.close()
    api = make_api(f"sqlite:///{path}", HashEmbedder(384), sections=MANUAL)
    cid = api.collection(api.a)
    doc = _indexed(api, api.a, cid, SECRET)
    api.client.delete(f"/v1/documents/{doc}", headers=api.a)
    _purge(api)
    check = sqlite3.connect(path)  # a pooled connection may report the mode it started with
    try:
        assert check.execute("PRAGMA auto_vacuum").fetchone() == (2,)
        assert check.execute("PRAGMA freelist_count").fetchone() == (0,)
        assert check.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    finally:
        check.close()
    assert scan([path, Path(f"{path}-wal")], word_needles(SECRET)) == []


def test_snapshots_of_collections_not_open_here_are_dropped_when_stale(
    make_api: Callable[..., Api], sqlite_url: str
) -> None:
    api = make_api(sqlite_url, HashEmbedder(384), sections=MANUAL)
    cid = api.collection(api.a, index={"kind": "hnsw"})
    doc = _indexed(api, api.a, cid, SECRET)
    api.client.post(f"/v1/collections/{cid}/search", json={"query": "tides"}, headers=api.a)
    api.services.indexes.snapshot(cid)
    api.services.indexes.forget(cid)  # as in a process that never opened it
    needles = document_needles(api.services.db, doc, SECRET)
    api.client.delete(f"/v1/documents/{doc}", headers=api.a)
    _purge(api)
    assert scan(api.services.settings.data_dir / "indexes", needles) == []
    # The next open rebuilds from SQL and finds nothing of it.
    assert len(api.services.indexes.get(cid)) == 0
    assert np.array_equal(api.services.indexes.get(cid).ids(), np.zeros(0, np.int64))


def test_purgers_in_several_processes_share_the_work(api: Api) -> None:
    """Every process runs a purger: together they erase each document once, without errors
    or deadlocks against each other (PostgreSQL skips the rows another holds)."""
    import threading

    from rag.config import PurgeSettings
    from rag.db import Database
    from rag.purge import Purger

    cid = api.collection(api.a)
    docs = [_indexed(api, api.a, cid, [f"{SECRET[0]}{i}"]) for i in range(6)]
    for doc in docs:
        api.client.delete(f"/v1/documents/{doc}", headers=api.a)
    url = api.services.db.url.render_as_string(hide_password=False)
    dbs = [Database(url) for _ in range(2)]
    purgers = [Purger(db, PurgeSettings(batch=2)) for db in dbs]
    errors: list[BaseException] = []
    erased: list[int] = []

    def run(purger: Purger) -> None:
        try:
            erased.append(purger.run_once().documents)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(p,)) for p in purgers]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    for db in dbs:
        db.dispose()
    assert errors == [] and sum(erased) == 6
    assert all(_rows_of(api, doc)["documents"] == 0 for doc in docs)


@pytest.mark.parametrize("kind", ["hnsw", "faiss_flat"])
def test_a_document_uploaded_after_a_delete_and_a_purge_stays_in_the_index(
    make_api: Callable[..., Api], sqlite_url: str, kind: str
) -> None:
    """Issue 31: SQLite handed the purged (highest) chunk ids out again, and the index purge
    then erased every id with a "remove" entry, the new document's included."""
    api = make_api(sqlite_url, HashEmbedder(384), sections=MANUAL)
    cid = api.collection(api.a, index={"kind": kind})
    kept = _indexed(api, api.a, cid, KEPT)
    doomed = _indexed(api, api.a, cid, SECRET)
    api.client.post(f"/v1/collections/{cid}/search", json={"query": "tides"}, headers=api.a)
    with api.services.db.read() as s:
        old_ids = set(s.scalars(select(Chunk.id).where(Chunk.document_id == doomed)))
        old_seq = int(s.scalar(select(func.max(ChangeLog.seq))) or 0)
    assert api.client.delete(f"/v1/documents/{doomed}", headers=api.a).status_code == 204
    _purge(api)
    new = _indexed(api, api.a, cid, ["lagoonpelicanqz"])
    _purge(api)
    with api.services.db.read() as s:
        new_ids = set(s.scalars(select(Chunk.id).where(Chunk.document_id == new)))
        kept_ids = set(s.scalars(select(Chunk.id).where(Chunk.document_id == kept)))
        new_seqs = set(s.scalars(select(ChangeLog.seq).where(ChangeLog.document_id == new)))
    assert min(new_ids) > max(old_ids)  # ids are never handed out twice
    assert min(new_seqs) > old_seq
    api.services.indexes.catch_up(cid)
    assert set(api.services.indexes.get(cid).ids().tolist()) == kept_ids | new_ids
    api.services.indexes.snapshot(cid)
    api.services.indexes.forget(cid)  # the next open loads the snapshot
    assert set(api.services.indexes.get(cid).ids().tolist()) == kept_ids | new_ids


def test_reclaim_never_waits_for_a_reader_holding_the_write_lock(api: Api) -> None:
    """Issue 31: the WAL checkpoint (TRUNCATE) waited up to the 60 s busy timeout for a long
    reader (an index rebuild) while holding the write lock: every upload stalled. It gives up
    at once and truncates on a later round."""
    import sqlite3
    import threading

    from rag.db.purge import reclaim

    db = api.services.db
    if not db.is_sqlite:
        pytest.skip("a SQLite WAL")
    cid = api.collection(api.a)
    _indexed(api, api.a, cid, KEPT)
    reader = sqlite3.connect(db.url.database or "", check_same_thread=False)
    try:
        reader.execute("BEGIN")
        reader.execute("SELECT count(*) FROM chunks").fetchone()  # a long read, as a rebuild's
        _indexed(api, api.a, cid, SECRET)  # frames the reader's snapshot does not see
        outcome: list[bool] = []
        worker = threading.Thread(target=lambda: outcome.append(reclaim(db)))
        t0 = time.monotonic()
        worker.start()
        worker.join(5)
        assert not worker.is_alive(), "the checkpoint waited for the reader"
        assert outcome == [False] and time.monotonic() - t0 < 5
        _indexed(api, api.a, cid, ["lagoonpelicanqz"])  # writers go on meanwhile
    finally:
        reader.rollback()
        reader.close()
    assert reclaim(db)  # the reader gone, the next round truncates


# ---------------------------------------------------------------- conversations

# Words of the documents a conversation's answers quote, and of its questions.
FERRY = "The {w} ferry leaves from pier 4 at 9:00 every morning, past the {w} lighthouse."
ASKED = "When does the {w} ferry leave?"


def _conversing(make_api: Callable[..., Api], db_url: str, **sections: dict[str, object]) -> Api:
    from tests.answer.conftest import FakeEngine

    api = make_api(db_url, HashEmbedder(384), engine=FakeEngine("It leaves at 9:00."),
                   sections={**MANUAL, **sections})  # fmt: skip
    api.services.settings.ask.relevance_threshold = -1.0
    return api


def _turn(api: Api, cid: str, conv: str, word: str) -> dict:
    body = {"question": ASKED.format(w=word), "conversation_id": conv, "k": 1}
    r = api.client.post(f"/v1/collections/{cid}/ask", json=body, headers=api.a)
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["answer_source"] != "refused" and word in out["answer"]  # the quote holds it
    return out  # type: ignore[no-any-return]


def _new_conversation(api: Api, cid: str) -> str:
    r = api.client.post(f"/v1/collections/{cid}/conversations", headers=api.a)
    assert r.status_code == 201, r.text
    return str(r.json()["id"])


def _files(api: Api) -> Path:
    """What the service wrote: the data directory and (beside it in these tests) the SQLite
    database's files."""
    database = Path(api.services.db.url.database or "")
    root = api.services.settings.data_dir.parent
    assert database.parent == root  # the database's files are among those scanned
    return root


def _conversation_rows(api: Api) -> dict[str, int]:
    from rag.db.models import Conversation, ConversationSource, ConversationTurn

    with api.services.db.read() as s:
        return {
            m.__tablename__: int(s.scalar(select(func.count()).select_from(m)) or 0)
            for m in (Conversation, ConversationTurn, ConversationSource)
        }


def test_a_deleted_conversation_leaves_no_bytes_in_any_file(
    make_api: Callable[..., Api], sqlite_url: str
) -> None:
    api = _conversing(make_api, sqlite_url)
    files = _files(api)
    cid = api.collection(api.a)
    for words in (SECRET, KEPT):
        item = api.upload_text(api.a, cid, FERRY.format(w=words[0]), filename=f"{words[0]}.txt")
        assert api.wait_job(api.a, item["job_id"])["state"] == "done"
    doomed, kept = _new_conversation(api, cid), _new_conversation(api, cid)
    _turn(api, cid, doomed, SECRET[0])
    _turn(api, cid, kept, KEPT[0])
    # The documents stay: only the conversation's text (its question) must go.
    question = word_needles([f"When does the {SECRET[0]} ferry"])
    assert leftover_bytes(scan(files, question)) > 0

    url = f"/v1/collections/{cid}/conversations/{doomed}"
    assert api.client.delete(url, headers=api.a).status_code == 204
    assert api.client.get(url, headers=api.a).status_code == 404  # gone at once
    _purge(api)
    assert scan(files, question) == []
    assert _conversation_rows(api)["conversations"] == 1
    kept_turn = word_needles([f"When does the {KEPT[0]} ferry"])
    assert leftover_bytes(scan(files, kept_turn)) > 0


@pytest.mark.parametrize("backend", ["sqlite", pytest.param("pg", marks=pytest.mark.pg)])
def test_deleting_a_document_erases_the_turns_it_served_and_the_rest_stays(
    make_api: Callable[..., Api], request: pytest.FixtureRequest, tmp_path: Path, backend: str
) -> None:
    url = f"sqlite:///{tmp_path / 'rag.db'}" if backend == "sqlite" else (
        request.getfixturevalue("pg_url"))  # fmt: skip
    api = _conversing(make_api, url)
    cid = api.collection(api.a)
    docs = {}
    for words in (SECRET, KEPT):
        item = api.upload_text(api.a, cid, FERRY.format(w=words[0]), filename=f"{words[0]}.txt")
        assert api.wait_job(api.a, item["job_id"])["state"] == "done"
        docs[words[0]] = item["document_id"]
    conv = _new_conversation(api, cid)
    _turn(api, cid, conv, SECRET[0])
    _turn(api, cid, conv, KEPT[0])
    if backend == "sqlite":
        assert leftover_bytes(scan(_files(api), word_needles(SECRET[:1]))) > 0
    conv_url = f"/v1/collections/{cid}/conversations/{conv}"

    assert api.client.delete(f"/v1/documents/{docs[SECRET[0]]}", headers=api.a).status_code == 204
    turns = api.client.get(conv_url, headers=api.a).json()["turns"]
    assert [t["ordinal"] for t in turns] == [2]  # left out at once, before any purge
    _purge(api)
    got = api.client.get(conv_url, headers=api.a).json()
    assert (got["turn_count"], got["erased_turns"]) == (1, 1)
    assert KEPT[0] in got["turns"][0]["question"]
    assert _conversation_rows(api) == {
        "conversations": 1, "conversation_turns": 1, "conversation_sources": 1,
    }  # fmt: skip
    # A new turn after the erasure takes the next place.
    _turn(api, cid, conv, KEPT[0])
    assert [t["ordinal"] for t in api.client.get(conv_url, headers=api.a).json()["turns"]] == [
        2, 3,
    ]  # fmt: skip
    if backend == "sqlite":
        assert scan(_files(api), word_needles(SECRET[:1])) == []
        assert leftover_bytes(scan(_files(api), word_needles(KEPT))) > 0
    else:
        with api.services.db.engine.connect() as conn:
            vacuumed = conn.execute(
                text(
                    "SELECT count(*) FROM pg_stat_user_tables WHERE relname IN "
                    "('conversations', 'conversation_turns', 'conversation_sources') "
                    "AND schemaname = current_schema() AND last_vacuum IS NOT NULL"
                )
            ).scalar()
        assert vacuumed == 3


def test_a_deleted_collection_and_expired_conversations_are_erased(
    make_api: Callable[..., Api], db_url: str
) -> None:
    # Retention: conversations untouched for more than about a second go.
    api = _conversing(make_api, db_url, conversations={"retention_days": 1.5 / 86400})
    cid, other = api.collection(api.a, name="one"), api.collection(api.a, name="two")
    for c in (cid, other):
        item = api.upload_text(api.a, c, FERRY.format(w=KEPT[0]))
        assert api.wait_job(api.a, item["job_id"])["state"] == "done"
    _turn(api, cid, _new_conversation(api, cid), KEPT[0])
    old = _new_conversation(api, other)
    _turn(api, other, old, KEPT[0])
    assert api.client.delete(f"/v1/collections/{cid}", headers=api.a).status_code == 204
    _purge(api)
    assert _conversation_rows(api) == {
        "conversations": 1, "conversation_turns": 1, "conversation_sources": 1,
    }  # fmt: skip
    time.sleep(2.0)
    fresh = _new_conversation(api, other)
    _purge(api)
    listed = api.client.get(f"/v1/collections/{other}/conversations", headers=api.a).json()
    assert [c["id"] for c in listed["conversations"]] == [fresh]
    assert _conversation_rows(api)["conversation_turns"] == 0


# Words of a question and of a feedback comment, to look for once their answers are erased.
NOTED = ["walrusquillqz", "pelicanfeatherqz"]


def _quality_api(make_api: Callable[..., Api], db_url: str) -> Api:
    from tests.answer.conftest import FakeEngine

    return make_api(
        db_url,
        HashEmbedder(384),
        engine=FakeEngine(),
        sections={**MANUAL, "ask": {"relevance_threshold": -1.0, "evidence": "all"}},
    )


def _answer(api: Api, cid: str, question: str, doc: str | None = None) -> str:
    body: dict[str, object] = {"question": question, "k": 2}
    if doc is not None:
        body["filter"] = {"document_ids": [doc]}
    r = api.client.post(f"/v1/collections/{cid}/ask", json=body, headers=api.a)
    assert r.status_code == 200, r.text
    return str(r.json()["answer_id"])


def _quality_files(api: Api) -> list[Path]:
    """The SQLite database's files and every file of the data directory."""
    db = Path(api.services.db.url.database or "")
    data = [p for p in api.services.settings.data_dir.rglob("*") if p.is_file()]
    return [db, Path(f"{db}-wal"), Path(f"{db}-shm"), *data]


def _quality_rows(api: Api) -> dict[str, int]:
    from rag.db.models import Answer, AnswerDocument, DriftState, DriftWindow, Feedback

    with api.services.db.read() as s:
        return {
            m.__tablename__: int(s.scalar(select(func.count()).select_from(m)) or 0)
            for m in (Answer, AnswerDocument, Feedback, DriftWindow, DriftState)
        }


def test_answers_feedback_and_drift_windows_leave_with_their_collection(
    make_api: Callable[..., Api], db_url: str
) -> None:
    """Issue 34: the questions asked of a deleted collection, their answers, feedback,
    embeddings, drift windows and state are out of SQL after the purge, and on SQLite out of
    every file."""
    from rag.db.models import Answer

    api = _quality_api(make_api, db_url)
    quality = api.services.quality
    assert quality is not None
    cid = api.collection(api.a)
    keep = api.collection(api.a, name="kept")
    _indexed(api, api.a, cid, KEPT)
    _indexed(api, api.a, keep, KEPT)
    ids = [_answer(api, cid, f"Where is the {NOTED[0]} kept, number {i}?") for i in range(3)]
    kept_id = _answer(api, keep, "What about the harbour lantern?")
    r = api.client.post(
        f"/v1/answers/{ids[0]}/feedback",
        json={"rating": "down", "comment": f"the {NOTED[1]} was wrong"},
        headers=api.a,
    )
    assert r.status_code == 200, r.text
    r = api.client.put(f"/v1/collections/{cid}/drift/reference", json={}, headers=api.a)
    assert r.status_code == 200 and r.json()["reference"] == 3, r.text
    quality.recorder.flush()
    with api.services.db.read() as s:
        vectors = [bytes(v) for v in s.scalars(select(Answer.question_embedding).where(
            Answer.collection_id == cid))]  # fmt: skip
    needles = word_needles(NOTED) + vector_needles(vectors)
    if api.services.db.is_sqlite:
        assert (
            leftover_bytes(scan(_quality_files(api), needles)) > 0
        )  # the search below means something
    before = _quality_rows(api)
    assert before["drift_windows"] == 3 and before["feedback"] == 1

    assert api.client.delete(f"/v1/collections/{cid}", headers=api.a).status_code == 204
    _purge(api)

    with api.services.db.read() as s:
        assert list(s.scalars(select(Answer.id))) == [kept_id]
    assert _quality_rows(api) == {
        "answers": 1, "answer_documents": 1, "feedback": 0, "drift_windows": 0, "drift_state": 0,
    }  # fmt: skip
    if api.services.db.is_sqlite:
        found = scan(_quality_files(api), needles)
        assert found == [], [(f.path.name, f.needle[:12], f.count) for f in found]


def test_an_answer_leaves_with_any_document_it_retrieved(
    make_api: Callable[..., Api], db_url: str
) -> None:
    from rag.db.models import Answer

    api = _quality_api(make_api, db_url)
    cid = api.collection(api.a)
    doomed = _indexed(api, api.a, cid, SECRET)
    kept = _indexed(api, api.a, cid, KEPT)
    gone = _answer(api, cid, f"What is {NOTED[0]}?", doc=doomed)
    stays = _answer(api, cid, "What is kept?", doc=kept)
    r = api.client.post(f"/v1/answers/{gone}/feedback", json={"rating": "up"}, headers=api.a)
    assert r.status_code == 200
    assert api.services.quality is not None
    api.services.quality.recorder.flush()
    needles = word_needles(NOTED[:1])
    if api.services.db.is_sqlite:
        assert leftover_bytes(scan(_quality_files(api), needles)) > 0
    assert api.client.delete(f"/v1/documents/{doomed}", headers=api.a).status_code == 204
    _purge(api)
    with api.services.db.read() as s:
        assert list(s.scalars(select(Answer.id))) == [stays]
    assert _quality_rows(api)["feedback"] == 0
    if api.services.db.is_sqlite:
        assert scan(_quality_files(api), needles) == []
    r = api.client.post(f"/v1/answers/{gone}/feedback", json={"rating": "up"}, headers=api.a)
    assert r.status_code == 404
