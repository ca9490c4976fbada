"""Keyword search in the database's own full-text engine (the BM25 side of hybrid search).

SQLite ranks with FTS5's bm25(); PostgreSQL with ts_rank_cd over an indexed tsvector. Both are
written in the chunks' own transactions, so keyword results are never behind the record.
Only words reach the engine (no query syntax), so no input can make a query fail.

A score depends on its own collection only. bm25() takes its statistics (how many rows, their
mean length, how many rows hold a word) from the whole FTS5 table, so each collection has a
table of its own, `chunks_fts_<collection id>` (contentless: the text stays in `chunks`),
written here with the chunks and emptied by the purge: with one shared table, a tenant's
scores moved when another tenant ingested a word, and a query read every tenant's postings.
PostgreSQL's ts_rank_cd reads only the passage's own words and positions.
"""

from __future__ import annotations

import re
from collections.abc import Collection as Sized
from collections.abc import Iterable, Sequence

from sqlalchemy import BindParameter, bindparam, text
from sqlalchemy.orm import Session

_WORD = re.compile(r"[^\W_]+", re.UNICODE)
MAX_TERMS = 32
_ID = re.compile(r"[0-9A-Za-z]{1,64}")
_PREFIX = "chunks_fts_"


# Words that say nothing about which passage is meant. OR-ed into the match they pull in most
# of the collection: slower, and BM25's idf only partly discounts them.
STOPWORDS = frozenset(
    "a an and are as at be but by can could did do does doing for from had has have how i if "
    "in into is it its me my no not of on or our should so than that the their them then "
    "there these they this those to was we were what when where which while who whom why "
    "will with would you your".split()
)


def terms(query: str) -> list[str]:
    """The query's distinct words, stopwords dropped (all of them kept if that is all)."""
    seen: dict[str, None] = {}
    for word in _WORD.findall(query.lower()):
        seen.setdefault(word, None)
    words = [w for w in seen if w not in STOPWORDS] or list(seen)
    return words[:MAX_TERMS]


def keyword_search(
    session: Session,
    collection_id: str,
    query: str,
    limit: int,
    allowed_ids: Sized[int] | None = None,
) -> list[tuple[int, float]]:
    """Chunk ids and scores (higher is better), best first, for any of the query's words.
    Tombstoned documents are excluded here too."""
    words = terms(query)
    if not words or limit <= 0:
        return []
    dialect = session.get_bind().dialect.name
    params: dict[str, object] = {"cid": collection_id, "limit": limit}
    allowed_sql = ""
    if allowed_ids is not None:
        if not allowed_ids:
            return []
        ids = sorted(int(i) for i in allowed_ids)
        allowed_sql = f" AND c.id IN ({','.join(str(i) for i in ids)})"
    if dialect == "sqlite":
        table = _table(collection_id)
        if not _exists(session, table):
            return []  # nothing ingested yet
        params["q"] = " OR ".join(f'"{w}"' for w in words)
        sql = (
            f"SELECT c.id, -bm25({table}) AS score FROM {table} "
            f"JOIN chunks c ON c.id = {table}.rowid "
            "JOIN documents d ON d.id = c.document_id "
            f"WHERE {table} MATCH :q AND c.collection_id = :cid AND d.deleted_at IS NULL"
            f"{allowed_sql} ORDER BY bm25({table}) LIMIT :limit"
        )
    else:
        params["q"] = " | ".join(words)
        sql = (
            "SELECT c.id, ts_rank_cd(to_tsvector('english', c.text), q) AS score "
            "FROM chunks c JOIN documents d ON d.id = c.document_id, "
            "to_tsquery('english', :q) q "
            "WHERE to_tsvector('english', c.text) @@ q AND c.collection_id = :cid "
            f"AND d.deleted_at IS NULL{allowed_sql} ORDER BY score DESC LIMIT :limit"
        )
    rows = session.execute(text(sql), params).all()
    return [(int(r[0]), float(r[1])) for r in rows]


# ---------------------------------------------------------------- SQLite's tables, one a collection


def add_chunks(session: Session, collection_id: str, rows: Sequence[tuple[int, str]]) -> None:
    """Index new chunks (id, text) of a collection; in the caller's transaction."""
    if not rows or not _is_sqlite(session):
        return
    table = _table(collection_id)
    session.execute(
        text(
            f"CREATE VIRTUAL TABLE IF NOT EXISTS {table} USING fts5("
            "text, content='', tokenize='porter unicode61')"
        )
    )
    session.execute(
        text(f"INSERT INTO {table}(rowid, text) VALUES (:id, :text)"),
        [{"id": chunk_id, "text": body} for chunk_id, body in rows],
    )


def remove_documents(session: Session, document_ids: Sequence[str]) -> None:
    """Take the chunks of these documents out of their collections' tables (before the chunk
    rows go: a contentless table is told each removed row's text)."""
    if not document_ids or not _is_sqlite(session):
        return
    ids: BindParameter[list[str]] = bindparam("ids", expanding=True)
    owners = session.execute(
        text("SELECT DISTINCT collection_id FROM chunks WHERE document_id IN :ids").bindparams(ids),
        {"ids": list(document_ids)},
    ).scalars()
    for collection_id in sorted(owners):
        table = _table(collection_id)
        if not _exists(session, table):
            continue
        session.execute(
            text(
                f"INSERT INTO {table}({table}, rowid, text) SELECT 'delete', id, text "
                "FROM chunks WHERE document_id IN :ids AND collection_id = :cid"
            ).bindparams(ids),
            {"ids": list(document_ids), "cid": collection_id},
        )


def drop_collections(session: Session, collection_ids: Iterable[str]) -> None:
    """Drop the tables of purged collections."""
    if not _is_sqlite(session):
        return
    for collection_id in collection_ids:
        session.execute(text(f"DROP TABLE IF EXISTS {_table(collection_id)}"))


def optimize(session: Session) -> None:
    """Merge every table's segments, so that removed rows' terms leave the file."""
    if not _is_sqlite(session):
        return
    for table in tables(session):
        session.execute(text(f"INSERT INTO {table}({table}) VALUES ('optimize')"))


def tables(session: Session) -> list[str]:
    """The full-text tables there are (SQLite; none elsewhere)."""
    if not _is_sqlite(session):
        return []
    rows = session.execute(
        text("SELECT name FROM sqlite_master WHERE type = 'table' AND sql LIKE 'CREATE VIRTUAL%'")
    ).scalars()
    return [n for n in rows if n.startswith(_PREFIX) and _ID.fullmatch(n[len(_PREFIX) :])]


def _table(collection_id: str) -> str:
    # The name is built from the id, never from input: ids are hex (models.new_id).
    if not _ID.fullmatch(collection_id):
        raise ValueError("a collection id must be alphanumeric")
    return _PREFIX + collection_id


def _exists(session: Session, table: str) -> bool:
    found = session.execute(
        text("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = :name"),
        {"name": table},
    ).first()
    return found is not None


def _is_sqlite(session: Session) -> bool:
    return session.get_bind().dialect.name == "sqlite"
