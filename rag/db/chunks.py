"""Chunks: the passages of indexed documents, their character spans and vectors.

Every read that can reach a caller joins the chunk's document and checks its tenant and
tombstone, so an index that lags the record can never leak a deleted or foreign chunk.
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
from sqlalchemy import (
    ColumnElement,
    Connection,
    Numeric,
    Row,
    Select,
    and_,
    bindparam,
    case,
    cast,
    exists,
    false,
    func,
    select,
)
from sqlalchemy.orm import Session

from rag.db import documents
from rag.db import vectors as vector_codec
from rag.db.models import Chunk, Document
from rag.errors import Invalid

MetaValue = str | int | float | bool
# Ids per IN list (SQLite allows 32766 bound values in one statement).
_IN_BATCH = 5000

# Only what a passage shows: the chunk's vector stays in the database. Built once: every
# search runs it, and building a statement costs more than running it on SQLite.
_HYDRATE = (
    select(
        Chunk.id,
        Chunk.uid,
        Chunk.document_id,
        Chunk.ordinal,
        Chunk.text,
        Chunk.start_char,
        Chunk.end_char,
        Document.filename,
        Document.meta.label("meta"),
    )
    .join(Document, Document.id == Chunk.document_id)
    .where(
        Chunk.id.in_(bindparam("ids", expanding=True)),
        Chunk.collection_id == bindparam("cid"),
        Chunk.tenant_id == bindparam("tenant"),
        Document.tenant_id == bindparam("tenant"),
        Document.deleted_at.is_(None),
    )
)


def hydrate(
    conn: Connection, tenant_id: str, collection_id: str, ids: Sequence[int]
) -> dict[int, Row[Any]]:
    """The visible chunks among `ids`, by id (id, document_id, ordinal, text, start_char,
    end_char, filename, meta). On a bare connection: it runs in every search."""
    if not ids:
        return {}
    rows = conn.execute(_HYDRATE, {"ids": list(ids), "cid": collection_id, "tenant": tenant_id})
    return {row.id: row for row in rows}


def visible_ids(
    session: Session, tenant_id: str, collection_id: str, ids: Sequence[int]
) -> set[int]:
    """The chunks among `ids` the tenant may still see in this collection (right before they
    are cited)."""
    if not ids:
        return set()
    return set(
        session.scalars(
            select(Chunk.id)
            .join(Document, Document.id == Chunk.document_id)
            .where(
                Chunk.id.in_(list(ids)),
                Chunk.tenant_id == tenant_id,
                Chunk.collection_id == collection_id,
                Document.tenant_id == tenant_id,
                Document.collection_id == collection_id,
                Document.deleted_at.is_(None),
            )
        )
    )


def list_page(
    session: Session, tenant_id: str, document_id: str, *, limit: int, offset: int
) -> list[Chunk]:
    documents.get(session, tenant_id, document_id)
    stmt = (
        select(Chunk)
        .where(Chunk.document_id == document_id, Chunk.tenant_id == tenant_id)
        .order_by(Chunk.ordinal)
        .offset(offset)
        .limit(limit)
    )
    return list(session.scalars(stmt))


def allowed_ids(
    session: Session,
    collection_id: str,
    document_ids: Sequence[str] | None,
    metadata: Mapping[str, MetaValue] | None,
) -> set[int]:
    """Chunk ids a search filter allows, resolved in SQL; the index filters inside its
    search."""
    stmt = (
        select(Chunk.id)
        .join(Document, Document.id == Chunk.document_id)
        .where(Chunk.collection_id == collection_id, Document.deleted_at.is_(None))
    )
    if document_ids:
        stmt = stmt.where(Document.id.in_(list(document_ids)))
    sqlite = session.get_bind().dialect.name == "sqlite"
    for key, value in (metadata or {}).items():
        _known(session, collection_id, key, sqlite)
        stmt = stmt.where(_meta_equals(key, value, sqlite))
    return set(session.scalars(stmt))


def count(session: Session, collection_id: str) -> int:
    """Chunk rows of the collection (tombstoned documents' included: an index sizing hint)."""
    stmt = select(func.count(Chunk.id)).where(Chunk.collection_id == collection_id)
    return int(session.scalar(stmt) or 0)


def _live_vectors_query(model_id: str) -> Select[int, bytes]:
    """Ids and vectors of chunks whose document is not tombstoned, embedded with `model_id`."""
    return (
        select(Chunk.id, Chunk.embedding)
        .join(Document, Document.id == Chunk.document_id)
        .where(Document.deleted_at.is_(None), Chunk.embedding_model == model_id)
    )


def live_vectors(
    session: Session, collection_id: str, model_id: str, dim: int, batch: int
) -> Iterator[tuple[npt.NDArray[np.int64], npt.NDArray[np.float32]]]:
    """Every live chunk's vector, in batches of `batch` (ids, [n, dim])."""
    query = (
        _live_vectors_query(model_id)
        .where(Chunk.collection_id == collection_id)
        .order_by(Chunk.id)
        .execution_options(yield_per=batch)
    )
    rows: list[tuple[int, bytes]] = []
    for row in session.execute(query):
        rows.append((row[0], row[1]))
        if len(rows) >= batch:
            yield vector_codec.decode_rows(rows, dim)
            rows = []
    if rows:
        yield vector_codec.decode_rows(rows, dim)


def live_among(conn: Connection, collection_id: str, ids: Sequence[int]) -> set[int]:
    """The ids among `ids` whose chunk is in the record and its document not tombstoned."""
    out: set[int] = set()
    wanted = [int(i) for i in ids]
    for start in range(0, len(wanted), _IN_BATCH):
        rows = conn.execute(
            select(Chunk.id)
            .join(Document, Document.id == Chunk.document_id)
            .where(
                Chunk.id.in_(wanted[start : start + _IN_BATCH]),
                Chunk.collection_id == collection_id,
                Document.deleted_at.is_(None),
            )
        )
        out.update(int(chunk_id) for (chunk_id,) in rows)
    return out


def live_ids(session: Session, collection_id: str, model_id: str) -> npt.NDArray[np.int64]:
    """Every id an index of the collection embedded with `model_id` should hold, sorted."""
    stmt = (
        select(Chunk.id)
        .join(Document, Document.id == Chunk.document_id)
        .where(
            Chunk.collection_id == collection_id,
            Document.deleted_at.is_(None),
            Chunk.embedding_model == model_id,
        )
        .order_by(Chunk.id)
    )
    return np.fromiter((int(i) for i in session.scalars(stmt)), dtype=np.int64)


def live_count(session: Session, collection_id: str, model_id: str) -> int:
    """How many vectors an index of the collection embedded with `model_id` should hold."""
    stmt = (
        select(func.count(Chunk.id))
        .join(Document, Document.id == Chunk.document_id)
        .where(
            Chunk.collection_id == collection_id,
            Document.deleted_at.is_(None),
            Chunk.embedding_model == model_id,
        )
    )
    return int(session.scalar(stmt) or 0)


def vectors_of(
    session: Session, collection_id: str, model_id: str, dim: int, ids: Sequence[int]
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float32]]:
    """The live chunks among `ids` with their vectors (the others are gone or tombstoned)."""
    if not ids:
        return np.zeros(0, np.int64), np.zeros((0, dim), np.float32)
    rows = session.execute(
        _live_vectors_query(model_id).where(
            Chunk.id.in_(list(ids)), Chunk.collection_id == collection_id
        )
    )
    return vector_codec.decode_rows(((r[0], r[1]) for r in rows), dim)


def attributes_of(
    session: Session, collection_id: str, ids: Sequence[int]
) -> list[tuple[str, dict[str, Any]]]:
    """(document id, document metadata) of each chunk of `ids`, in their order: what an index
    that filters inside its own search (Milvus) stores beside the vector."""
    if not len(ids):
        return []
    rows = session.execute(
        select(Chunk.id, Chunk.document_id, Document.meta)
        .join(Document, Document.id == Chunk.document_id)
        .where(Chunk.id.in_([int(i) for i in ids]), Chunk.collection_id == collection_id)
    )
    found = {int(r[0]): (str(r[1]), dict(r[2] or {})) for r in rows}
    return [found.get(int(i), ("", {})) for i in ids]


def metadata_keys_known(
    session: Session, collection_id: str, metadata: Mapping[str, MetaValue] | None
) -> None:
    """Invalid when no document of the collection has one of the filter's keys (the check
    `allowed_ids` makes, for searches whose filter the index applies itself)."""
    sqlite = session.get_bind().dialect.name == "sqlite"
    for key in metadata or {}:
        _known(session, collection_id, key, sqlite)


# A filter's key/value means the same on SQLite, PostgreSQL and in Milvus's post-filter
# (rag.index.filters.matches): the document's value has the filter value's JSON type
# and equals it (a boolean is not a number, 3 equals 3.0; nothing is cast, so a value of
# another type does not match rather than fail), and a key is looked up as one key, never as
# a JSON path (SQLite's paths have no escape for `"`).


def _known(session: Session, collection_id: str, key: str, sqlite: bool) -> None:
    found = session.scalar(
        select(Document.id)
        .where(Document.collection_id == collection_id, _meta_has(key, sqlite))
        .limit(1)
    )
    if found is None:
        raise Invalid(f"no document in this collection has the metadata key {key!r}")


def _meta_has(key: str, sqlite: bool) -> ColumnElement[bool]:
    if sqlite:
        entry = func.json_each(Document.meta).table_valued("key", "type")
        return exists().select_from(entry).where(entry.c.key == key)
    return Document.meta.op("->")(key).is_not(None)


def _meta_equals(key: str, value: MetaValue, sqlite: bool) -> ColumnElement[bool]:
    if sqlite:
        entry = func.json_each(Document.meta).table_valued("key", "value", "type")
        if isinstance(value, bool):
            same = entry.c.type == ("true" if value else "false")
        elif isinstance(value, int | float):
            same = and_(entry.c.type.in_(("integer", "real")), entry.c.value == value)
        else:
            same = and_(entry.c.type == "text", entry.c.value == value)
        return exists().select_from(entry).where(entry.c.key == key, same)
    kind = func.json_typeof(Document.meta.op("->")(key))
    as_text = Document.meta[key].as_string()
    if isinstance(value, bool):
        return and_(kind == "boolean", as_text == ("true" if value else "false"))
    if isinstance(value, int | float):
        # CASE, not AND: PostgreSQL may evaluate AND's operands in any order, and the cast
        # fails on text.
        return case((kind == "number", cast(as_text, Numeric) == value), else_=false())
    return and_(kind == "string", as_text == value)


def sample_texts(session: Session, collection_id: str, n: int, seed: int = 0) -> list[str]:
    """The texts of up to `n` chunks drawn at random (seeded) from the collection."""
    total = count(session, collection_id)
    if total == 0:
        return []
    offsets = sorted(random.Random(seed).sample(range(total), min(n, total)))
    texts = []
    for off in offsets:
        text = session.scalar(
            select(Chunk.text)
            .where(Chunk.collection_id == collection_id)
            .order_by(Chunk.id)
            .offset(off)
            .limit(1)
        )
        if text:
            texts.append(text)
    return texts


def passages_of(session: Session, tenant_id: str, collection_id: str, limit: int) -> list[Row[Any]]:
    """The collection's first `limit` visible chunks, oldest first (id, text, filename): what
    a warm-up of the generator's passage cache computes."""
    stmt = (
        select(Chunk.id, Chunk.text, Document.filename)
        .join(Document, Document.id == Chunk.document_id)
        .where(
            Chunk.collection_id == collection_id,
            Chunk.tenant_id == tenant_id,
            Document.tenant_id == tenant_id,
            Document.deleted_at.is_(None),
        )
        .order_by(Chunk.id)
        .limit(limit)
    )
    return list(session.execute(stmt))


def documents_of_chunks(session: Session, chunk_ids: Sequence[int]) -> dict[int, str]:
    """chunk id -> its document, for the chunks among `chunk_ids` still in the record."""
    out: dict[int, str] = {}
    ids = list(chunk_ids)
    for start in range(0, len(ids), 500):
        rows = session.execute(
            select(Chunk.id, Chunk.document_id).where(Chunk.id.in_(ids[start : start + 500]))
        )
        out.update({int(c): str(d) for c, d in rows})
    return out
