"""Keyword search in the database's own full-text engine (the BM25 side of hybrid search).

SQLite ranks with FTS5's bm25(); PostgreSQL with ts_rank_cd over an indexed tsvector. Both are
written in the chunks' own transactions, so keyword results are never behind the record.
Only words reach the engine (no query syntax), so no input can make a query fail.
"""

from __future__ import annotations

import re
from collections.abc import Collection as Sized

from sqlalchemy import text
from sqlalchemy.orm import Session

_WORD = re.compile(r"[^\W_]+", re.UNICODE)
MAX_TERMS = 32


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
        params["q"] = " OR ".join(f'"{w}"' for w in words)
        sql = (
            "SELECT c.id, -bm25(chunks_fts) AS score FROM chunks_fts "
            "JOIN chunks c ON c.id = chunks_fts.rowid "
            "JOIN documents d ON d.id = c.document_id "
            "WHERE chunks_fts MATCH :q AND c.collection_id = :cid AND d.deleted_at IS NULL"
            f"{allowed_sql} ORDER BY bm25(chunks_fts) LIMIT :limit"
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
