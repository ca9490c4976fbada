"""Factories for the query-module tests: tenants, collections, uploaded documents (with their
ingest job) and indexed documents (chunks, vectors, full text and change log, written as the
worker writes them). Every row goes in through rag.db's own functions, into the test's own
database (the `db` fixture: a SQLite file and a PostgreSQL schema)."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
from sqlalchemy import update

from rag.db import Database, collections, documents, keys, seed
from rag.db.conversations import Owner
from rag.db.documents import Accepted
from rag.db.models import Document

MODEL = "test-4"
DIM = 4


def unit_vector(text: str) -> npt.NDArray[np.float32]:
    """A deterministic L2-normalised vector for a passage (its sha256 seeds it)."""
    seed_ = int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little")
    v = np.random.default_rng(seed_).standard_normal(DIM).astype(np.float32)
    return v / np.linalg.norm(v)


class Make:
    """Rows of the test's own database, made through rag.db."""

    def __init__(self, db: Database) -> None:
        self.db = db
        self._n = 0

    def _next(self) -> int:
        self._n += 1
        return self._n

    def tenant(self, name: str | None = None) -> str:
        with self.db.write() as s:
            return keys.tenant(s, name or f"tenant-{self._next()}", create=True).id

    def tenant_and_collection(self) -> tuple[str, str]:
        """A new tenant and a collection of its own."""
        tenant = self.tenant()
        return tenant, self.collection(tenant)

    def key_in_collection(self) -> tuple[Owner, str]:
        """A (non-admin) key of a new tenant, and a collection of that tenant."""
        tenant, cid = self.tenant_and_collection()
        return Owner(tenant, f"key-{self._next()}", is_admin=False), cid

    def collection(self, tenant_id: str, name: str | None = None, **fields: Any) -> str:
        values: dict[str, Any] = {
            "name": name or f"c{self._next()}", "embedding_model": MODEL, "embedding_dim": DIM,
            "chunk_tokens": 64, "chunk_overlap": 8, "index_kind": "auto", "index_params": {},
            "search_defaults": {},
        }  # fmt: skip
        values.update(fields)
        with self.db.write() as s:
            return collections.create(s, tenant_id, **values).id

    def upload(
        self,
        collection_id: str,
        data: bytes | None = None,
        *,
        filename: str | None = None,
        meta: dict[str, Any] | None = None,
        max_attempts: int = 3,
    ) -> Accepted:
        """A document as an upload leaves it: queued, with its blob and its ingest job."""
        n = self._next()
        body = f"document {n}".encode() if data is None else data
        with self.db.write() as s:
            c = collections.get_live(s, collection_id)
            assert c is not None
            return documents.add(
                s, c, filename=filename or f"d{n}.txt", media_type="text/plain", data=body,
                sha256=hashlib.sha256(body).hexdigest(), meta=meta or {},
                max_attempts=max_attempts,
            )  # fmt: skip

    def indexed(
        self,
        collection_id: str,
        passages: Sequence[str],
        *,
        meta: dict[str, Any] | None = None,
        filename: str | None = None,
        data: bytes | None = None,
    ) -> seed.Seeded:
        """One indexed document whose chunks are `passages`, in order (`data`: its bytes,
        by default made from its number and text)."""
        n = self._next()
        text, rows = seed.joined(passages, " ")
        doc = seed.SeedDocument(
            filename=filename or f"d{n}.txt",
            data=f"{n}:{text}".encode() if data is None else data,
            text=text,
            chunks=rows,
            vectors=np.stack([unit_vector(p) for p in passages]),
            meta=meta or {},
        )
        [written] = seed.documents(self.db, collection_id, [doc], MODEL)
        return written

    def set_created(self, document_ids: Sequence[str], at: float) -> None:
        """Give documents one creation time (ties that keyset pagination must break)."""
        with self.db.write() as s:
            s.execute(update(Document).where(Document.id.in_(document_ids)).values(created_at=at))


@pytest.fixture
def make(db: Database) -> Make:
    return Make(db)
