"""Logs carry request ids and never document text, queries, prompts or keys."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable

import pytest

from rag.embed import HashEmbedder
from rag.ops.logs import JsonFormatter, RequestIdFilter, request_id
from tests.conftest import Api
from tests.ops.conftest import RecordingEngine

SECRET_TEXT = "The quokkazanzibar ferry leaves from pier four at nine every morning."
SECRET_QUERY = "when does the quokkazanzibar ferry leave"


def _lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    formatter = JsonFormatter()
    return [formatter.format(record) for record in caplog.records]


def test_no_document_text_query_or_key_in_logs(
    make_api: Callable[..., Api],
    sqlite_url: str,
    hash_embedder: HashEmbedder,
    caplog: pytest.LogCaptureFixture,
) -> None:
    engine = RecordingEngine()
    api = make_api(sqlite_url, hash_embedder, engine=engine)
    caplog.handler.addFilter(RequestIdFilter())
    caplog.set_level(logging.DEBUG)
    cid = api.collection(api.a)
    item = api.upload_text(api.a, cid, SECRET_TEXT, metadata={"source": "x"})
    assert api.wait_job(api.a, item["job_id"])["state"] == "done"
    r = api.client.post(
        f"/v1/collections/{cid}/search",
        json={"query": SECRET_QUERY, "hybrid": 0.5},
        headers={**api.a, "X-Request-ID": "req-logs-1"},
    )
    assert r.status_code == 200 and r.json()["passages"]
    assert (
        api.client.get(
            "/v1/collections", headers={"Authorization": "Bearer rag_wrongkey"}
        ).status_code
        == 401
    )
    # Ask: the prompt holds the passage and the question; neither may reach the log.
    ask = api.client.post(
        f"/v1/collections/{cid}/ask", json={"question": SECRET_QUERY}, headers=api.a
    )
    assert ask.status_code == 200, ask.text
    assert engine.prompts and "quokkazanzibar" in json.dumps(engine.prompts[0])
    logging.getLogger("rag.test").info("a line inside no request")
    lines = _lines(caplog)
    assert lines, "nothing was logged at DEBUG"
    keys = [
        api.a["Authorization"].split()[1],
        api.b["Authorization"].split()[1],
        "test-admin-key-0123456789",
        "rag_wrongkey",
    ]
    for line in lines:
        assert "quokkazanzibar" not in line.lower(), line
        for key in keys:
            assert key not in line, line
        parsed = json.loads(line)
        assert "request_id" in parsed
    assert json.loads(lines[-1])["request_id"] == "-"


def test_request_id_reaches_log_lines(sqlite_api: Api, caplog: pytest.LogCaptureFixture) -> None:
    api = sqlite_api
    caplog.handler.addFilter(RequestIdFilter())
    caplog.set_level(logging.DEBUG)
    # Keys are created through the API: auth logs a line inside the request.
    r = api.client.post(
        "/v1/keys",
        json={"tenant": "tenant-c"},
        headers={"Authorization": "Bearer test-admin-key-0123456789", "X-Request-ID": "rid-42"},
    )
    assert r.status_code in (200, 201), r.text
    assert r.headers["x-request-id"] == "rid-42"
    ids = {
        getattr(rec, "request_id", None) for rec in caplog.records if rec.name.startswith("rag.")
    }
    assert "rid-42" in ids
    assert r.json().get("key", "") not in "".join(_lines(caplog))
    assert request_id.get() == "-"


def test_a_database_error_in_the_log_carries_no_parameters(
    db_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Errors are logged with their traceback (the worker, the API's last resort), and a
    database error's message would quote the statement's parameters: here a document's text,
    written for a collection that is gone (deleted while its job ran)."""
    from sqlalchemy.exc import IntegrityError

    from rag.db import Database
    from rag.db.migrate import upgrade
    from rag.db.models import Document

    db = Database(db_url)
    upgrade(db)
    row = Document(
        tenant_id="gone", collection_id="gone", filename="f.txt", media_type="text/plain",
        sha256="0" * 64, size=len(SECRET_TEXT), text=SECRET_TEXT, meta={},
    )  # fmt: skip
    try:
        with pytest.raises(IntegrityError) as caught, db.write() as session:
            session.add(row)
        caplog.set_level(logging.ERROR)
        logging.getLogger("rag.test").error("write failed", exc_info=caught.value)
    finally:
        db.dispose()
    assert "quokkazanzibar" not in str(caught.value)
    lines = _lines(caplog)
    assert lines and "IntegrityError" in lines[-1]
    assert "quokkazanzibar" not in lines[-1]


def test_request_ids_are_unique_and_made_without_a_system_call(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Ids are made on the event loop, one or more a request: uuid4 read the system's random
    source, a system call that lets go of the GIL, and the loop then waited for its turn to
    take it back once a request."""
    import os
    import re

    from rag.ops.logs import new_id

    def no(_: int) -> bytes:
        raise AssertionError("a system call per id")

    monkeypatch.setattr(os, "urandom", no)
    ids = [new_id() for _ in range(20_000)]
    assert len(set(ids)) == len(ids)
    assert all(re.fullmatch(r"[0-9a-f]{32}", i) for i in ids)


def test_a_forked_child_makes_ids_of_its_own() -> None:
    """The generator is seeded once a process: a child forked from it is seeded again."""
    import os

    from rag.ops.logs import new_id

    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its next id, to the parent
        os.write(write, new_id().encode())
        os._exit(0)
    os.close(write)
    os.waitpid(pid, 0)
    child = os.read(read, 64).decode()
    os.close(read)
    assert len(child) == 32 and child != new_id()
