"""Shared fixtures: real SQLite files, a fresh PostgreSQL schema per test, the real embedder,
and the real app (most API tests use the hash embedder: they are about HTTP, auth and
storage; the end-to-end tests use the real all-MiniLM-L6-v2)."""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from rag.api.app import create_app
from rag.api.loopback import LiveServer  # noqa: F401  (tests import it from here)
from rag.auth import create_key
from rag.config import Settings
from rag.db import Database
from rag.db.migrate import upgrade
from rag.embed import Embedder, HashEmbedder, SentenceTransformerEmbedder
from rag.services import Services, build_services

# Test apps build the generator when a test asks for one, not in the background as each
# starts (a test that wants the background load says so).
os.environ.setdefault("RAG_ENGINE__LOAD_AT_START", "false")

PG_URL = os.environ.get("RAG_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")


def _pg_available() -> bool:
    try:
        engine = create_engine(PG_URL, connect_args={"connect_timeout": 3})
        with engine.connect():
            pass
        engine.dispose()
        return True
    except Exception:
        return False


_PG = _pg_available()


@pytest.fixture(scope="session")
def pg_available() -> bool:
    if not _PG:
        if os.environ.get("CI"):
            pytest.fail(f"PostgreSQL is not reachable at {PG_URL}")
        pytest.skip(f"PostgreSQL is not reachable at {PG_URL}")
    return True


@pytest.fixture
def pg_url(pg_available: bool) -> Iterator[str]:
    """A PostgreSQL URL whose search_path is a schema of this test's own."""
    schema = f"t_{uuid.uuid4().hex[:12]}"
    admin = create_engine(PG_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE SCHEMA "{schema}"'))
    url = make_url(PG_URL).update_query_dict({"options": f"-csearch_path={schema}"})
    try:
        yield url.render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))
        admin.dispose()


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'rag.db'}"


@pytest.fixture(params=["sqlite", pytest.param("pg", marks=pytest.mark.pg)])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'rag.db'}"
    return request.getfixturevalue("pg_url")  # type: ignore[no-any-return]


@pytest.fixture
def db(db_url: str) -> Iterator[Database]:
    database = Database(db_url)
    upgrade(database)
    yield database
    database.dispose()


@pytest.fixture(scope="session")
def minilm() -> SentenceTransformerEmbedder:
    """The real bundled all-MiniLM-L6-v2, loaded once per test session."""
    return SentenceTransformerEmbedder(device="cpu")


@pytest.fixture
def hash_embedder() -> HashEmbedder:
    return HashEmbedder(384)


def make_settings(
    tmp_path: Path,
    db_url: str | None = None,
    sections: dict[str, dict[str, object]] | None = None,
    **ingest: object,
) -> Settings:
    """`sections`: other settings by section, e.g. {"purge": {"interval_s": 0.2}}."""
    values: dict[str, object] = {
        "parse_timeout_s": 20.0,
        "advanced": {"backoff_base_s": 0.05, "poll_interval_s": 0.05, "lease_s": 5.0},
    }
    values.update(ingest)
    sections = dict(sections or {})
    return Settings(
        data_dir=tmp_path / "data",
        database={"url": db_url},
        ingest=values,
        auth={"admin_key": "test-admin-key-0123456789"},
        **sections,  # type: ignore[arg-type]
    )


ADMIN = {"Authorization": "Bearer test-admin-key-0123456789"}


class Api:
    """A TestClient with the keys of two tenants."""

    def __init__(self, client: TestClient, services: Services) -> None:
        self.client = client
        self.services = services
        key_a, _ = create_key(services.db, "tenant-a")
        key_b, _ = create_key(services.db, "tenant-b")
        self.a = {"Authorization": f"Bearer {key_a}"}
        self.b = {"Authorization": f"Bearer {key_b}"}

    def collection(self, headers: dict[str, str], name: str = "docs", **body: object) -> str:
        r = self.client.post("/v1/collections", json={"name": name, **body}, headers=headers)
        assert r.status_code == 201, r.text
        return str(r.json()["id"])

    def upload_text(self, headers: dict[str, str], cid: str, text: str, **body: object) -> dict:
        r = self.client.post(
            f"/v1/collections/{cid}/documents", json={"text": text, **body}, headers=headers
        )
        assert r.status_code == 202, r.text
        return r.json()["documents"][0]  # type: ignore[no-any-return]

    def wait_job(self, headers: dict[str, str], job_id: str, timeout: float = 60) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            r = self.client.get(f"/v1/jobs/{job_id}", params={"wait": 10}, headers=headers)
            assert r.status_code == 200, r.text
            if r.json()["done"]:
                return r.json()  # type: ignore[no-any-return]
        raise AssertionError(f"job {job_id} not done after {timeout} s")


@pytest.fixture
def make_api(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Callable[..., Api]]:
    clients: list[TestClient] = []

    def close(client: TestClient) -> None:
        if client in clients:
            clients.remove(client)
            client.__exit__(None, None, None)

    def factory(
        db_url: str | None,
        embedder: Embedder,
        engine: object | None = None,
        sections: dict[str, dict[str, object]] | None = None,
        **ingest: object,
    ) -> Api:
        """`engine`: a generator to use instead of building the configured one; `sections`:
        settings other than ingest's (see make_settings)."""
        settings = make_settings(tmp_path, db_url, sections, **ingest)
        services = build_services(settings, embedder=embedder, engine=engine)  # type: ignore[arg-type]
        client = TestClient(create_app(settings, services))
        client.__enter__()
        clients.append(client)
        # Registered now, so it runs before the teardown of fixtures set up earlier (a
        # PostgreSQL schema must outlive the workers polling it).
        request.node.addfinalizer(lambda: close(client))
        return Api(client, services)

    yield factory
    for client in list(clients):
        close(client)


@pytest.fixture
def api(make_api: Callable[..., Api], db_url: str, hash_embedder: Embedder) -> Api:
    return make_api(db_url, hash_embedder)


@pytest.fixture
def sqlite_api(make_api: Callable[..., Api], sqlite_url: str, hash_embedder: Embedder) -> Api:
    return make_api(sqlite_url, hash_embedder)
