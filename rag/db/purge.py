"""The purge: what a delete tombstoned leaves the record for good.

A delete only tombstones (searches and answers stop seeing the document at once); the purge,
a background loop in every process (rag.purge), then erases in batches: the document's chunks
(and with them their full-text entries: a trigger on SQLite, the expression index on
PostgreSQL), its extracted text, metadata and job, its tenant's copy of the blob once no
document of that tenant uses it, the conversation turns whose passages came from it (their
question and answer text; the rest of each conversation stays), and a deleted collection's
row once it has no documents, with its conversations. Deleted conversations, and with a
retention those left untouched longer, are erased the same way. With them go the recorded
answers that retrieved the document or belong to the collection, their feedback, and the
collection's drift windows and state (rag.db.answers).

The change log keeps one "remove" entry per purged chunk (written here for a deleted
collection's chunks, which the delete itself did not log): ids only, never content. Every
process tails those entries to drop what it derived from the chunk (index vectors, cached
KV). The "add" entries of purged chunks go.

`reclaim` then makes the bytes leave the files: on SQLite (secure_delete is on for every
connection, so freed pages are zeroed) the full-text index is merged into one segment without
the deleted entries, free pages are given back (incremental vacuum) and the WAL is
checkpointed and truncated when no reader is in it (never waiting for one: a later round
does it); on PostgreSQL the tables are vacuumed.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from sqlalchemy import delete, exists, func, insert, literal, select
from sqlalchemy.orm import Session

from rag.db import answers, conversations, fulltext
from rag.db.locks import lock_collection
from rag.db.models import Blob, ChangeLog, Chunk, Collection, Document, IngestJob, now
from rag.db.session import BUSY_TIMEOUT_MS, Database

log = logging.getLogger(__name__)

# The tables a purge deletes from (vacuumed on PostgreSQL).
PURGED_TABLES = (
    "chunks", "documents", "blobs", "change_log", "ingest_jobs", "collections",
    "conversations", "conversation_turns", "conversation_sources",
    "answers", "answer_documents", "feedback", "drift_windows", "drift_state",
)  # fmt: skip


@dataclass(frozen=True)
class Purged:
    """One document erased from the record."""

    tenant_id: str
    collection_id: str
    document_id: str
    chunk_ids: tuple[int, ...]


def purge_documents(db: Database, limit: int) -> list[Purged]:
    """Erase up to `limit` tombstoned documents (oldest delete first) in one transaction.
    Several processes may purge at once: PostgreSQL skips the rows another purger holds,
    SQLite serialises the writers."""
    with db.write() as session:
        candidates = session.execute(
            select(Document.id, Document.collection_id)
            .where(Document.deleted_at.is_not(None))
            .order_by(Document.deleted_at, Document.id)
            .limit(limit)
        ).all()
        if not candidates:
            return []
        # Collections first, in one order, as every change-log writer locks them (seq order
        # is commit order, and no purger and ingest writer wait on each other in a cycle).
        for collection_id in sorted({c.collection_id for c in candidates}):
            lock_collection(session, collection_id)
        stmt = select(
            Document.id, Document.tenant_id, Document.collection_id, Document.sha256
        ).where(Document.id.in_([c.id for c in candidates]), Document.deleted_at.is_not(None))
        if not db.is_sqlite:
            stmt = stmt.with_for_update(skip_locked=True)
        docs = session.execute(stmt).all()
        if not docs:
            return []
        doc_ids = [d.id for d in docs]
        chunks: dict[str, list[int]] = {d: [] for d in doc_ids}
        for chunk_id, doc_id in session.execute(
            select(Chunk.id, Chunk.document_id)
            .where(Chunk.document_id.in_(doc_ids))
            .order_by(Chunk.id)
        ):
            chunks[doc_id].append(int(chunk_id))
        _log_removes(session, doc_ids)
        session.execute(
            delete(ChangeLog).where(ChangeLog.document_id.in_(doc_ids), ChangeLog.op == "add")
        )
        fulltext.remove_documents(session, doc_ids)
        # Answers that retrieved any of them (they may quote it), with their feedback.
        answers.erase_for_documents(session, doc_ids)
        session.execute(delete(Chunk).where(Chunk.document_id.in_(doc_ids)))
        session.execute(delete(IngestJob).where(IngestJob.document_id.in_(doc_ids)))
        conversations.erase_turns_of_documents(session, doc_ids)
        session.execute(delete(Document).where(Document.id.in_(doc_ids)))
        for tenant_id, sha256 in sorted({(d.tenant_id, d.sha256) for d in docs}):
            _drop_blob_if_unused(session, tenant_id, sha256)
        return [Purged(d.tenant_id, d.collection_id, d.id, tuple(chunks[d.id])) for d in docs]


def _log_removes(session: Session, doc_ids: list[str]) -> None:
    """A "remove" entry for every chunk of these documents that has none: a document deleted
    on its own logged them at the delete; a deleted collection's documents did not."""
    logged = exists().where(ChangeLog.document_id == Chunk.document_id, ChangeLog.op == "remove")
    rows = select(
        Chunk.collection_id, literal("remove"), Chunk.id, Chunk.document_id, literal(now())
    ).where(Chunk.document_id.in_(doc_ids), ~logged)
    session.execute(
        insert(ChangeLog).from_select(
            ["collection_id", "op", "chunk_id", "document_id", "created_at"], rows
        )
    )


def _drop_blob_if_unused(session: Session, tenant_id: str, sha256: str) -> None:
    used = exists().where(Document.tenant_id == tenant_id, Document.sha256 == sha256)
    session.execute(delete(Blob).where(Blob.tenant_id == tenant_id, Blob.sha256 == sha256, ~used))


def purge_collections(db: Database) -> list[str]:
    """Erase the rows of deleted collections whose documents are all purged; their ids."""
    with db.write() as session:
        has_documents = exists().where(Document.collection_id == Collection.id)
        ids = list(
            session.scalars(
                select(Collection.id).where(Collection.deleted_at.is_not(None), ~has_documents)
            )
        )
        if ids:
            fulltext.drop_collections(session, ids)
            while conversations.erase(session, conversations.doomed(None, ids), 1000):
                pass
            answers.erase_collections(session, ids)
            session.execute(delete(Collection).where(Collection.id.in_(ids)))
        return ids


def purge_conversations(db: Database, retention_s: float | None, limit: int) -> list[str]:
    """Erase up to `limit` conversations: deleted ones, and with a retention those untouched
    for longer (every turn with them); their ids. A deleted collection's go with it."""
    with db.write() as session:
        ids = conversations.erase(session, conversations.doomed(retention_s), limit)
        answers.erase_for_conversations(session, ids)
        return ids


def expire_answers(db: Database, before: float, limit: int) -> int:
    """Erase up to `limit` answers (and their feedback) given before `before`."""
    with db.write() as session:
        return answers.expire(session, before, limit)


def pending(db: Database, retention_s: float | None = None) -> int:
    """Tombstoned documents, deleted collections and conversations not purged yet."""
    with db.read() as session:
        docs = session.scalar(
            select(func.count()).select_from(Document).where(Document.deleted_at.is_not(None))
        )
        cols = session.scalar(
            select(func.count()).select_from(Collection).where(Collection.deleted_at.is_not(None))
        )
        convs = conversations.pending(session, retention_s)
    return int(docs or 0) + int(cols or 0) + convs


def reclaim(db: Database, *, full_vacuum: bool = False, convert: bool = True) -> bool:
    """Make purged bytes leave the database's files; False when something was busy (a
    reader held the WAL) and it should be tried again. `convert`: a SQLite database made
    before the purge existed is rewritten once (VACUUM) so that it can give pages back."""
    if db.is_sqlite:
        return _reclaim_sqlite(db, convert=convert)
    _vacuum_postgres(db, full=full_vacuum)
    return True


def _reclaim_sqlite(db: Database, *, convert: bool) -> bool:
    with db.write() as session:
        # A contentless FTS5 table keeps a deleted row's terms in its segments until they are
        # merged; one merge of everything leaves none (secure_delete zeroes the old pages).
        fulltext.optimize(session)
    with db.engine.connect() as conn:
        raw = conn.connection.dbapi_connection
        assert raw is not None
        mode = raw.execute("PRAGMA auto_vacuum").fetchone()[0]
        if mode != 2 and convert:
            # A database made before the purge existed: turn incremental vacuum on, once
            # (VACUUM rewrites the whole file, zeroes and all).
            log.info("purge: converting the SQLite database to incremental vacuum")
            raw.executescript("PRAGMA auto_vacuum=INCREMENTAL; VACUUM;")
        elif mode == 2:
            # executescript steps the pragma to its end (a plain execute frees one page).
            raw.executescript("PRAGMA incremental_vacuum;")
        # TRUNCATE takes the write lock and then waits (the busy handler) for every reader
        # to leave the WAL: behind a long reader (an index rebuild) every writer would stall
        # for the busy timeout. Without a busy handler it gives up at once instead, and the
        # deleted bytes left in the WAL go on a later round, once the reader is done.
        raw.execute("PRAGMA busy_timeout=0")
        try:
            busy, _log_frames, _done = raw.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
        finally:
            raw.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
    if busy:
        log.info("purge: the WAL is in use; truncating it next round")
    return not busy


def _vacuum_postgres(db: Database, *, full: bool) -> None:
    verb = "VACUUM (FULL, ANALYZE)" if full else "VACUUM (ANALYZE)"
    with db.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        for table in PURGED_TABLES:
            conn.exec_driver_sql(f"{verb} {table}")
