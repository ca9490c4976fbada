"""SQL → index: what kind a collection's index is, building one from the rows, and applying
the change log to it."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import numpy as np

from rag.db import Database, changelog, chunks, collections
from rag.errors import Invalid, NotFound
from rag.index import build_index, default_kind_for
from rag.index.base import Ids, VectorIndex, Vectors

log = logging.getLogger(__name__)

_BUILD_BATCH = 5000


@dataclass(frozen=True)
class Spec:
    kind: str
    params: dict[str, Any]
    auto: bool  # the kind follows the collection's size


class SqlSource:
    """The rows an index of one embedding model and dimension is derived from."""

    def __init__(self, db: Database, embedding_model_id: str, dim: int, catch_up_batch: int):
        self.db = db
        self.embedding_model_id = embedding_model_id
        self.dim = dim
        self.catch_up_batch = catch_up_batch

    def spec(self, collection_id: str) -> Spec:
        """The kind and parameters the collection's row declares (auto: by its size)."""
        with self.db.read() as session:
            collection = collections.get_live(session, collection_id)
            if collection is None:
                raise NotFound(f"collection {collection_id} not found")
            if (
                collection.embedding_model != self.embedding_model_id
                or collection.embedding_dim != self.dim
            ):
                raise Invalid(
                    f"collection {collection_id} uses {collection.embedding_model} "
                    f"({collection.embedding_dim}-d); this index serves "
                    f"{self.embedding_model_id} ({self.dim}-d)"
                )
            kind = collection.index_kind or "auto"
            if kind == "auto":
                return Spec(default_kind_for(chunks.count(session, collection_id)), {}, True)
            return Spec(kind, dict(collection.index_params or {}), False)

    def build(
        self, collection_id: str, kind: str, params: dict[str, Any]
    ) -> tuple[VectorIndex, int]:
        """A new index of every live chunk, and the watermark it reflects."""
        index = build_index(kind, self.dim, params)
        watermark = self.fill(collection_id, index)
        log.info(
            "index %s built from SQL: %s, %d vectors, watermark %d",
            collection_id,
            kind,
            len(index),
            watermark,
        )
        return index, watermark

    def fill(self, collection_id: str, index: VectorIndex) -> int:
        """Add every live chunk to `index`; returns the watermark the rows reflect."""
        # The watermark is read first: anything committed after it is replayed by catch-up,
        # and replaying a change the rows already reflect is harmless (add replaces).
        with self.db.read() as session:
            watermark = changelog.head(session, collection_id)
        with self.db.read() as session:
            for ids, vectors in chunks.live_vectors(
                session, collection_id, self.embedding_model_id, self.dim, _BUILD_BATCH
            ):
                self._add(session, collection_id, index, ids, vectors)
        return watermark

    def add_vectors(
        self, collection_id: str, index: VectorIndex, ids: Ids, vectors: Vectors
    ) -> None:
        """Add rows read from SQL to `index` (with their attributes, where it keeps them)."""
        self._add(None, collection_id, index, ids, vectors)

    def _add(
        self,
        session: Any,  # a read session of rag.db, or None to open one
        collection_id: str,
        index: VectorIndex,
        ids: Ids,
        vectors: Vectors,
    ) -> None:
        if not index.wants_attributes:
            index.add(ids, vectors)
            return
        # An index that filters inside its own search (Milvus) keeps each chunk's document id
        # and metadata beside its vector.
        if session is None:
            with self.db.read() as own:
                attrs = chunks.attributes_of(own, collection_id, ids.tolist())
        else:
            attrs = chunks.attributes_of(session, collection_id, ids.tolist())
        index.add(ids, vectors, attrs)

    def apply_changes(
        self, collection_id: str, index: VectorIndex, watermark: int
    ) -> tuple[int, int]:
        """Apply change-log rows after `watermark` to `index`; returns (rows, new watermark).
        The caller holds the collection's lock."""
        applied = 0
        while True:
            with self.db.connect() as conn:
                rows = changelog.changes_after(conn, collection_id, watermark, self.catch_up_batch)
            if not rows:
                return applied, watermark
            # Only the last change to a chunk matters within a batch.
            final: dict[int, str] = {}
            for _seq, op, chunk_id in rows:
                final[chunk_id] = op
            wanted = [c for c, op in final.items() if op == "add"]
            found: tuple[Ids, Vectors] = (
                np.zeros(0, np.int64),
                np.zeros((0, self.dim), np.float32),
            )
            if wanted:
                with self.db.read() as session:
                    found = chunks.vectors_of(
                        session, collection_id, self.embedding_model_id, self.dim, wanted
                    )
            ids, vectors = found
            present = set(ids.tolist())
            # An add whose chunk is gone or whose document is tombstoned is a remove.
            gone = [c for c, op in final.items() if op != "add" or c not in present]
            if gone:
                index.remove(np.array(gone, dtype=np.int64))
            if len(ids):
                self._add(None, collection_id, index, ids, vectors)
            applied += len(rows)
            watermark = rows[-1][0]
            if len(rows) < self.catch_up_batch:
                return applied, watermark
