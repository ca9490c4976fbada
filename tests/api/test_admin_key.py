"""The bootstrap admin key: a configured one replaces the earlier configured and the generated
one, keys an operator chose are stored without their first characters, short ones are refused
at startup (readably, without the key), and a generated one goes to a file only its owner can
read, never to stdout."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest
from pydantic import ValidationError

from rag.auth import CONFIGURED, authenticate, create_key_with_id, hash_key
from rag.config import Settings
from rag.db import Database
from rag.db import keys as key_rows
from rag.db.migrate import upgrade
from rag.embed import HashEmbedder
from rag.errors import Unauthorized
from rag.services import build_services

K1 = "first-configured-admin-key"
K2 = "second-configured-admin-key"


def _start(data_dir: Path, db_url: str, key: str | None) -> Database:
    settings = Settings(data_dir=data_dir, database={"url": db_url}, auth={"admin_key": key})
    services = build_services(settings, embedder=HashEmbedder(16), in_process_worker=False)
    services.close()
    database = Database(db_url)
    return database


def _works(db: Database, key: str) -> bool:
    try:
        return authenticate(db, f"Bearer {key}").is_admin
    except Unauthorized:
        return False


def test_a_new_configured_key_revokes_the_earlier_and_the_generated_one(
    tmp_path: Path, db_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    db = _start(tmp_path, db_url, None)
    generated = (tmp_path / "admin-key").read_text().strip()
    assert _works(db, generated)
    # An admin key made through the API is the operator's business: it stays.
    made, _, _ = create_key_with_id(db, "admin", is_admin=True)
    db.dispose()
    db = _start(tmp_path, db_url, K1)
    assert _works(db, K1) and not _works(db, generated) and _works(db, made)
    db.dispose()
    db = _start(tmp_path, db_url, K2)
    assert _works(db, K2) and not _works(db, K1) and _works(db, made)
    with db.read() as session:
        rows = {r.key_hash: r for r in key_rows.list_all(session)}
    assert rows[hash_key(K2)].prefix == CONFIGURED
    assert rows[hash_key(K1)].prefix == CONFIGURED  # nothing of a chosen secret is kept
    assert made.startswith(rows[hash_key(made)].prefix) and len(rows[hash_key(made)].prefix) < 16
    # Rolling the configuration back makes the earlier key live again.
    db.dispose()
    db = _start(tmp_path, db_url, K1)
    assert _works(db, K1) and not _works(db, K2)
    db.dispose()
    assert K1 not in capsys.readouterr().out


def test_rows_from_before_are_scrubbed_and_revoked(tmp_path: Path, sqlite_url: str) -> None:
    db = Database(sqlite_url)
    upgrade(db)
    with db.write() as session:  # as the service stored them before
        tenant = key_rows.tenant(session, "admin", create=True)
        key_rows.add(session, tenant.id, hash_key("rag_" + "g" * 43), "rag_gggggg", is_admin=True)
        key_rows.add(
            session, tenant.id, hash_key("old-operator-secret"), "old-operat", is_admin=True
        )
    db.dispose()
    db = _start(tmp_path, sqlite_url, K1)
    assert not _works(db, "rag_" + "g" * 43) and not _works(db, "old-operator-secret")
    with db.read() as session:
        prefixes = {r.prefix for r in key_rows.list_all(session)}
    assert "old-operat" not in prefixes
    db.dispose()


def test_a_short_configured_key_is_refused_at_startup_without_showing_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("RAG_AUTH__ADMIN_KEY", "short-secret")
    with pytest.raises(ValidationError) as caught:
        Settings()
    message = str(caught.value)
    assert "at least 16" in message and "12 characters" in message
    assert "short-secret" not in message


def test_the_generated_key_goes_to_an_owner_only_file_not_stdout(
    tmp_path: Path, sqlite_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    db = _start(tmp_path, sqlite_url, None)
    path = tmp_path / "admin-key"
    key = path.read_text().strip()
    assert key.startswith("rag_") and _works(db, key)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    out = capsys.readouterr().out
    assert str(path) in out and key not in out
    with db.read() as session:
        (row,) = key_rows.list_all(session)
    assert key.startswith(row.prefix) and len(row.prefix) < 16
    db.dispose()
    # A second start finds a live admin key: nothing new is generated.
    db = _start(tmp_path, sqlite_url, None)
    assert path.read_text().strip() == key
    db.dispose()
