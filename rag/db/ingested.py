"""What a finished ingest job writes, in one transaction for a batch: its chunks with their
vectors, the change-log entries the indexes catch up from, the document indexed and the job
done. Each job is fenced on its own lease: one whose lease was lost writes nothing."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from sqlalchemy import select
from sqlalchemy.orm import Session

from rag.db import fulltext
from rag.db import vectors as vector_codec
from rag.db.jobs import ClaimedJob, LeaseLost, ours
from rag.db.locks import lock_collection
from rag.db.models import ChangeLog, Chunk, Document, IngestJob, now
from rag.db.session import Database


@dataclass(frozen=True)
class ChunkRow:
    ordinal: int
    text: str
    start_char: int
    end_char: int
    token_count: int


def chunk_uid(document_id: str, row: ChunkRow) -> str:
    key = f"{document_id}:{row.ordinal}:{row.start_char}:{row.end_char}"
    return hashlib.sha256(key.encode()).hexdigest()


@dataclass(frozen=True)
class Finished:
    """A job ready to be written: its text, chunks and their vectors."""

    job: ClaimedJob
    text: str
    chunks: Sequence[ChunkRow]
    vectors: npt.NDArray[np.float32]


def complete(
    db: Database,
    job: ClaimedJob,
    *,
    text: str,
    chunks: Sequence[ChunkRow],
    vectors: npt.NDArray[np.float32],
    embedding_model: str,
) -> str:
    """One transaction: chunks with their vectors, change-log rows, document indexed, job
    done. Returns the job's final state."""
    state = complete_many(db, [Finished(job, text, chunks, vectors)], embedding_model)[job.id]
    if state == "lost":
        raise LeaseLost(job.id)
    return state


def complete_many(db: Database, batch: Sequence[Finished], embedding_model: str) -> dict[str, str]:
    """Write a batch of jobs in one transaction (one commit for the batch). Each job is still
    fenced on its own lease: a job whose lease was lost is skipped ("lost") and the others are
    written. Returns each job's final state: done, cancelled or lost."""
    states: dict[str, str] = {}
    with db.write() as session:
        # Collection rows locked in one order, so two workers cannot deadlock.
        for collection_id in sorted({f.job.collection_id for f in batch}):
            lock_collection(session, collection_id)
        for item in batch:
            states[item.job.id] = _write_job(session, item, embedding_model)
    return states


def _write_job(session: Session, item: Finished, embedding_model: str) -> str:
    job = item.job
    job_row = session.scalar(select(IngestJob).where(ours(job)))
    if job_row is None:
        return "lost"
    doc = session.get(Document, job.document_id)
    t = now()
    if doc is None or doc.deleted_at is not None:
        job_row.state, job_row.error = "cancelled", "document deleted"
        job_row.finished_at = job_row.updated_at = t
        job_row.lease_owner = None
        return "cancelled"
    index_document(session, doc, item.text, item.chunks, item.vectors, embedding_model, t)
    job_row.state = "done"
    job_row.error = None
    job_row.finished_at = job_row.updated_at = t
    job_row.lease_owner = None
    job_row.lease_expires_at = None
    return "done"


def index_document(
    session: Session,
    doc: Document,
    text: str,
    chunks: Sequence[ChunkRow],
    vectors: npt.NDArray[np.float32],
    embedding_model: str,
    at: float,
) -> list[Chunk]:
    """A document's chunks with their vectors, full-text rows and change-log entries, and the
    document marked indexed, in the caller's transaction (which holds the collection's lock).
    The one write of indexed chunks: the worker's, and rag.db.seed's for tests and benches."""
    blobs = vector_codec.encode_rows(vectors)
    rows = [
        Chunk(
            uid=chunk_uid(doc.id, c),
            document_id=doc.id,
            collection_id=doc.collection_id,
            tenant_id=doc.tenant_id,
            ordinal=c.ordinal,
            text=c.text,
            start_char=c.start_char,
            end_char=c.end_char,
            token_count=c.token_count,
            embedding=blobs[i],
            embedding_model=embedding_model,
        )
        for i, c in enumerate(chunks)
    ]
    session.add_all(rows)
    session.flush()
    fulltext.add_chunks(session, doc.collection_id, [(r.id, r.text) for r in rows])
    session.add_all(
        ChangeLog(collection_id=doc.collection_id, op="add", chunk_id=r.id, document_id=doc.id)
        for r in rows
    )
    doc.text = text
    doc.status = "indexed"
    doc.chunk_count = len(rows)
    doc.error = None
    doc.indexed_at = doc.updated_at = at
    return rows
