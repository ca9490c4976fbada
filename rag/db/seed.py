"""Indexed documents written straight from precomputed vectors, for tests and benchmarks that
need a collection without running the worker.

The chunks go in through `ingested.index_document`, the write a finished ingest job makes
(chunks, full-text rows, change-log entries, document indexed), so a seeded collection reads
exactly as an ingested one: the indexes catch up from its change log, keyword search finds
its words. Only the queue is skipped: no job is made or claimed.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from rag.db.ingested import ChunkRow, index_document
from rag.db.locks import lock_collection
from rag.db.models import Blob, Document, now
from rag.db.session import Database
from rag.errors import NotFound


@dataclass(frozen=True)
class SeedDocument:
    """One document to write as indexed: its bytes, its text, chunks and their vectors."""

    filename: str
    data: bytes
    text: str
    chunks: Sequence[ChunkRow]
    vectors: npt.NDArray[np.float32]
    meta: dict[str, Any] = field(default_factory=dict)
    media_type: str = "text/plain"


@dataclass(frozen=True)
class Seeded:
    """A written document: its id, and its chunks' ids and uids in ordinal order."""

    document_id: str
    chunk_ids: list[int]
    chunk_uids: list[str]


def one_chunk(text: str) -> ChunkRow:
    """A passage that is its document's only chunk."""
    return ChunkRow(0, text, 0, len(text), len(text.split()))


def joined(passages: Sequence[str], sep: str = "\n\n") -> tuple[str, list[ChunkRow]]:
    """A document's text made of `passages` joined by `sep`, and its chunks: one a passage,
    at the passage's span."""
    rows, start = [], 0
    for i, passage in enumerate(passages):
        rows.append(ChunkRow(i, passage, start, start + len(passage), len(passage.split())))
        start += len(passage) + len(sep)
    return sep.join(passages), rows


def documents(
    db: Database, collection_id: str, docs: Sequence[SeedDocument], embedding_model: str
) -> list[Seeded]:
    """Write `docs` into the collection as indexed, in one transaction; their blobs are shared
    with the tenant's other documents of the same bytes, as uploads share them."""
    seeded = []
    with db.write() as session:
        collection = lock_collection(session, collection_id)
        if collection is None:
            raise NotFound(f"collection {collection_id} not found")
        tenant_id = collection.tenant_id
        t = now()
        for d in docs:
            sha = hashlib.sha256(d.data).hexdigest()
            if session.get(Blob, (tenant_id, sha)) is None:
                session.add(Blob(tenant_id=tenant_id, sha256=sha, size=len(d.data), data=d.data))
            doc = Document(
                tenant_id=tenant_id,
                collection_id=collection_id,
                filename=d.filename,
                media_type=d.media_type,
                sha256=sha,
                size=len(d.data),
                meta=d.meta,
                created_at=t,
            )
            session.add(doc)
            session.flush()  # the document's id, which its chunks' uids are made from
            rows = index_document(session, doc, d.text, d.chunks, d.vectors, embedding_model, t)
            seeded.append(Seeded(doc.id, [r.id for r in rows], [r.uid for r in rows]))
    return seeded
