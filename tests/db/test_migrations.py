"""Migrations upgrade from empty and downgrade cleanly, on SQLite and PostgreSQL."""

from __future__ import annotations

import pytest
from sqlalchemy import inspect, text
from sqlalchemy.exc import IntegrityError

from rag.db import Database
from rag.db.migrate import downgrade, upgrade
from rag.db.models import Base

TABLES = {
    "tenants",
    "api_keys",
    "collections",
    "blobs",
    "documents",
    "chunks",
    "ingest_jobs",
    "change_log",
}


def test_upgrade_from_empty_matches_the_models_and_downgrades_cleanly(db_url: str) -> None:
    db = Database(db_url)
    try:
        upgrade(db)
        insp = inspect(db.engine)
        assert set(insp.get_table_names()) >= TABLES
        for table in Base.metadata.sorted_tables:
            live = {c["name"] for c in insp.get_columns(table.name)}
            assert live == {c.name for c in table.columns}, table.name
        downgrade(db)
        left = set(inspect(db.engine).get_table_names()) - {"alembic_version"}
        assert not any(t.startswith("chunks_fts") for t in left)
        assert left == set()
        upgrade(db)  # and up again
        assert set(inspect(db.engine).get_table_names()) >= TABLES
    finally:
        db.dispose()


def test_models_and_migrations_agree(db_url: str) -> None:
    """Autogenerate finds nothing to do: no model change lacks its migration."""
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext

    db = Database(db_url)
    try:
        upgrade(db)
        with db.engine.connect() as conn:
            # Full-text structures are dialect-specific and live outside the models.
            ctx = MigrationContext.configure(
                conn,
                opts={
                    "include_name": lambda name, kind, _: (
                        not (name or "").startswith(("chunks_fts", "ix_chunks_fts"))
                    )
                },
            )
            diff = compare_metadata(ctx, Base.metadata)
        assert diff == []
    finally:
        db.dispose()


def test_blobs_become_per_tenant_and_nothing_else_moves(db_url: str) -> None:
    """0005 on a database with data: a blob two tenants share becomes one copy each, an
    unused blob goes, and rebuilding the documents table cascades nothing into its children
    (chunks and jobs stay)."""
    db = Database(db_url)
    try:
        upgrade(db, "0004")
        with db.engine.begin() as conn:
            for t in ("ta", "tb"):
                conn.execute(
                    text("INSERT INTO tenants (id, name, created_at) VALUES (:t, :t, 0)"), {"t": t}
                )
                conn.execute(
                    text(
                        "INSERT INTO collections (id, tenant_id, name, description, "
                        "embedding_model, embedding_dim, chunk_tokens, chunk_overlap, index_kind, "
                        "index_params, search_defaults, created_at) VALUES "
                        "(:c, :t, 'c', '', 'm', 4, 200, 32, 'auto', '{}', '{}', 0)"
                    ),
                    {"c": f"c{t}", "t": t},
                )
            for sha, data in (("s1", b"shared bytes"), ("s2", b"unused bytes")):
                conn.execute(
                    text(
                        "INSERT INTO blobs (sha256, size, data, created_at) VALUES (:s, :n, :d, 0)"
                    ),
                    {"s": sha, "n": len(data), "d": data},
                )
            for t in ("ta", "tb"):
                conn.execute(
                    text(
                        "INSERT INTO documents (id, tenant_id, collection_id, filename, "
                        "media_type, sha256, size, status, metadata, chunk_count, created_at, "
                        "updated_at) VALUES (:d, :t, :c, 'f', 'text/plain', 's1', 12, 'indexed', "
                        "'{}', 1, 0, 0)"
                    ),
                    {"d": f"d{t}", "t": t, "c": f"c{t}"},
                )
                conn.execute(
                    text(
                        "INSERT INTO chunks (uid, document_id, collection_id, tenant_id, ordinal, "
                        "text, start_char, end_char, token_count, embedding, embedding_model, "
                        "created_at) VALUES (:u, :d, :c, :t, 0, 'x', 0, 1, 1, :e, 'm', 0)"
                    ),
                    {"u": f"u{t}", "d": f"d{t}", "c": f"c{t}", "t": t, "e": b"\0" * 16},
                )
                conn.execute(
                    text(
                        "INSERT INTO ingest_jobs (id, tenant_id, collection_id, document_id, "
                        "state, attempts, max_attempts, run_after, created_at, updated_at) VALUES "
                        "(:j, :t, :c, :d, 'done', 1, 5, 0, 0, 0)"
                    ),
                    {"j": f"j{t}", "t": t, "c": f"c{t}", "d": f"d{t}"},
                )
        upgrade(db)
        with db.engine.connect() as conn:
            blobs = conn.execute(text("SELECT tenant_id, sha256, data FROM blobs")).all()
            assert sorted(blobs) == [("ta", "s1", b"shared bytes"), ("tb", "s1", b"shared bytes")]
            assert conn.execute(text("SELECT count(*) FROM documents")).scalar() == 2
            assert conn.execute(text("SELECT count(*) FROM chunks")).scalar() == 2
            assert conn.execute(text("SELECT count(*) FROM ingest_jobs")).scalar() == 2
        # 0008: each collection's chunks are in its own full-text table (SQLite).
        from sqlalchemy.orm import Session

        from rag.db.fulltext import keyword_search

        with Session(db.engine) as session:
            hits = {c: keyword_search(session, c, "x", 5) for c in ("cta", "ctb")}
        assert all(len(h) == 1 for h in hits.values()) and hits["cta"] != hits["ctb"]
        # The documents' foreign key now names their own tenant's copy.
        with pytest.raises(IntegrityError), db.engine.begin() as conn:
            conn.execute(text("DELETE FROM blobs WHERE tenant_id = 'ta'"))
        downgrade(db, "0004")
        with db.engine.connect() as conn:
            assert conn.execute(text("SELECT sha256 FROM blobs")).scalars().all() == ["s1"]
            assert conn.execute(text("SELECT count(*) FROM chunks")).scalar() == 2
    finally:
        db.dispose()


def test_ids_purged_before_0008_are_never_handed_out_again(db_url: str) -> None:
    """0008 on a database whose highest chunk was purged: its id (named by a "remove" entry)
    and the purged entries' seqs stay used; full text keeps working on the rebuilt table."""
    db = Database(db_url)
    try:
        upgrade(db, "0007")
        chunk = (
            "INSERT INTO chunks (id, uid, document_id, collection_id, tenant_id, ordinal, text, "
            "start_char, end_char, token_count, embedding, embedding_model, created_at) VALUES "
            "(:i, :u, 'd', 'c', 't', 0, :x, 0, 1, 1, :e, 'm', 0)"
        )
        entry = (
            "INSERT INTO change_log (seq, collection_id, op, chunk_id, document_id, created_at) "
            "VALUES (:s, 'c', :op, :i, 'd', 0)"
        )
        with db.engine.begin() as conn:
            conn.execute(text("INSERT INTO tenants (id, name, created_at) VALUES ('t', 't', 0)"))
            conn.execute(
                text(
                    "INSERT INTO collections (id, tenant_id, name, description, "
                    "embedding_model, embedding_dim, chunk_tokens, chunk_overlap, index_kind, "
                    "index_params, search_defaults, created_at) VALUES "
                    "('c', 't', 'c', '', 'm', 4, 200, 32, 'auto', '{}', '{}', 0)"
                )
            )
            conn.execute(
                text(
                    "INSERT INTO blobs (tenant_id, sha256, size, data, created_at) VALUES "
                    "('t', 's', 1, 'x', 0)"
                )
            )
            conn.execute(
                text(
                    "INSERT INTO documents (id, tenant_id, collection_id, filename, "
                    "media_type, sha256, size, status, metadata, chunk_count, created_at, "
                    "updated_at) VALUES ('d', 't', 'c', 'f', 'text/plain', 's', 1, 'indexed', "
                    "'{}', 1, 0, 0)"
                )
            )
            conn.execute(text(chunk), {"i": 1, "u": "u1", "x": "kept words", "e": b"\0" * 16})
            # Chunk 2 and the seqs up to 3 were handed out; the purge left only the remove.
            conn.execute(text(entry), {"s": 1, "op": "add", "i": 1})
            conn.execute(text(entry), {"s": 3, "op": "remove", "i": 2})
        upgrade(db, "0008")
        with db.engine.begin() as conn:
            conn.execute(
                text(
                    "INSERT INTO chunks (uid, document_id, collection_id, tenant_id, ordinal, "
                    "text, start_char, end_char, token_count, embedding, embedding_model, "
                    "created_at) VALUES ('u3', 'd', 'c', 't', 1, 'pelican words', 0, 1, 1, "
                    ":e, 'm', 0)"
                ),
                {"e": b"\0" * 16},
            )
            conn.execute(
                text(
                    "INSERT INTO change_log (collection_id, op, chunk_id, document_id, "
                    "created_at) VALUES ('c', 'add', 3, 'd', 0)"
                )
            )
            new_id = conn.execute(text("SELECT id FROM chunks WHERE uid = 'u3'")).scalar()
            seq = conn.execute(text("SELECT max(seq) FROM change_log")).scalar()
            assert new_id is not None and new_id > 2
            assert seq is not None and seq > 3
            conn.execute(text("DELETE FROM chunks WHERE uid = 'u3'"))
            conn.execute(text("DELETE FROM change_log WHERE seq = :s"), {"s": seq})
            again = conn.execute(
                text(
                    "INSERT INTO chunks (uid, document_id, collection_id, tenant_id, ordinal, "
                    "text, start_char, end_char, token_count, embedding, embedding_model, "
                    "created_at) VALUES ('u4', 'd', 'c', 't', 2, 'w', 0, 1, 1, :e, 'm', 0) "
                    "RETURNING id"
                ),
                {"e": b"\0" * 16},
            ).scalar()
            assert again is not None and again > new_id
            if db.is_sqlite:
                hits = conn.execute(
                    text("SELECT rowid FROM chunks_fts WHERE chunks_fts MATCH 'kept'")
                ).scalars()
                assert list(hits) == [1]
                conn.execute(text("DELETE FROM chunks WHERE id = 1"))
                left = conn.execute(
                    text("SELECT count(*) FROM chunks_fts WHERE chunks_fts MATCH 'kept'")
                ).scalar()
                assert left == 0
        downgrade(db, "0007")
        upgrade(db)
    finally:
        db.dispose()
