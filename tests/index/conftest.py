"""A real SQLite file and a seeder that writes chunks and change-log rows the way ingest does."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest
from sqlalchemy import select

from rag.db import seed
from rag.db.ingested import ChunkRow
from rag.db.models import Base, ChangeLog, Chunk, Collection, Document, Tenant
from rag.db.session import Database

MODEL = "test-model"
DIM = 16


@pytest.fixture
def db(tmp_path: Path) -> Iterator[Database]:
    database = Database(f"sqlite:///{tmp_path / 'rag.db'}")
    Base.metadata.create_all(database.engine)
    yield database
    database.dispose()


class Seeder:
    def __init__(self, db: Database, *, model: str = MODEL, dim: int = DIM) -> None:
        self.db = db
        self.model = model
        self.dim = dim
        self.rng = np.random.default_rng(0)
        self._n = 0
        with db.write() as s:
            tenant = Tenant(name="acme")
            s.add(tenant)
            s.flush()
            self.tenant_id = tenant.id

    def collection(self, kind: str = "auto", params: dict | None = None) -> str:
        with self.db.write() as s:
            c = Collection(
                tenant_id=self.tenant_id,
                name=f"c{time.monotonic_ns()}",
                embedding_model=self.model,
                embedding_dim=self.dim,
                chunk_tokens=200,
                chunk_overlap=32,
                index_kind=kind,
                index_params=params or {},
            )
            s.add(c)
            s.flush()
            return c.id

    def vectors(self, n: int) -> npt.NDArray[np.float32]:
        x = self.rng.standard_normal((n, self.dim)).astype(np.float32)
        return x / np.linalg.norm(x, axis=1, keepdims=True)

    def document(
        self, collection_id: str, n_chunks: int, vectors: npt.NDArray[np.float32] | None = None
    ) -> tuple[str, list[int], npt.NDArray[np.float32]]:
        """One document with its chunks and their "add" change-log rows, in one transaction,
        written as ingest writes them."""
        vecs = self.vectors(n_chunks) if vectors is None else vectors
        self._n += 1
        doc = seed.SeedDocument(
            filename=f"d{self._n}.txt",
            data=f"document {self._n}".encode(),
            text=f"document {self._n}",
            chunks=[ChunkRow(i, f"chunk {i}", 0, 1, 1) for i in range(n_chunks)],
            vectors=vecs,
        )
        [written] = seed.documents(self.db, collection_id, [doc], self.model)
        return written.document_id, written.chunk_ids, vecs

    def delete_document(self, document_id: str, *, log_removes: bool = True) -> list[int]:
        """Tombstone a document; its "remove" rows go in the same transaction."""
        with self.db.write() as s:
            doc = s.get(Document, document_id)
            assert doc is not None
            s.get(Collection, doc.collection_id, with_for_update=True)
            doc.deleted_at = time.time()
            doc.status = "deleted"
            ids = list(s.scalars(select(Chunk.id).where(Chunk.document_id == document_id)))
            if log_removes:
                for chunk_id in ids:
                    s.add(
                        ChangeLog(
                            collection_id=doc.collection_id,
                            op="remove",
                            chunk_id=chunk_id,
                            document_id=document_id,
                        )
                    )
            return ids


@pytest.fixture
def seeder(db: Database) -> Seeder:
    return Seeder(db)
