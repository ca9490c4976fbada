"""SIGKILL the worker again and again under a stream of uploads: every acknowledged upload
ends `indexed` exactly once — none lost, none doubled."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from sqlalchemy import func, select

from rag.db import Database
from rag.db.models import ChangeLog, Chunk, Document, IngestJob
from rag.embed import HashEmbedder
from tests.conftest import Api

CYCLES = 20


def spawn_worker(db_url: str, data_dir: Path) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "RAG_DATABASE__URL": db_url,
        "RAG_DATA_DIR": str(data_dir),
        "RAG_EMBED__BACKEND": "hash",
        "RAG_INGEST__LEASE_S": "1.0",
        "RAG_INGEST__POLL_INTERVAL_S": "0.05",
        "RAG_INGEST__BACKOFF_BASE_S": "0.05",
        "RAG_INGEST__MAX_ATTEMPTS": "100",
        "RAG_AUTH__ADMIN_KEY": "test-admin-key",
        "RAG_LOG_LEVEL": "WARNING",
    }
    return subprocess.Popen(
        [sys.executable, "-m", "rag.cli", "worker"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def verify_exactly_once(db: Database, acknowledged: set[str]) -> dict[str, int]:
    with db.read() as s:
        docs = {d.id: d for d in s.scalars(select(Document))}
        chunk_rows = s.execute(
            select(
                Chunk.document_id, func.count(), func.count(func.distinct(Chunk.ordinal))
            ).group_by(Chunk.document_id)
        ).all()
        adds = dict(
            s.execute(
                select(ChangeLog.document_id, func.count())
                .where(ChangeLog.op == "add")
                .group_by(ChangeLog.document_id)
            ).all()
        )
        jobs_per_doc = dict(
            s.execute(
                select(IngestJob.document_id, func.count()).group_by(IngestJob.document_id)
            ).all()
        )
    per_doc = {doc_id: (n, distinct) for doc_id, n, distinct in chunk_rows}
    lost = [d for d in acknowledged if d not in docs or docs[d].status != "indexed"]
    doubled = [
        d
        for d, (n, distinct) in per_doc.items()
        if n != distinct or n != docs[d].chunk_count or adds.get(d) != n
    ]
    extra_jobs = [d for d, n in jobs_per_doc.items() if n != 1]
    return {
        "acknowledged": len(acknowledged),
        "lost": len(lost),
        "duplicated": len(doubled),
        "extra_jobs": len(extra_jobs),
    }


@pytest.mark.slow
def test_sigkill_cycles_lose_nothing(make_api, db_url: str, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    emb = HashEmbedder()
    api: Api = make_api(db_url, emb, in_process_worker=False)
    cid = api.collection(api.a)
    acknowledged: set[str] = set()
    stop = threading.Event()
    rng = random.Random(7)

    def uploader() -> None:
        i = 0
        while not stop.is_set():
            words = " ".join(f"w{rng.randrange(10_000)}" for _ in range(rng.randrange(50, 1500)))
            r = api.client.post(
                f"/v1/collections/{cid}/documents", headers=api.a, json={"text": f"doc {i} {words}"}
            )
            assert r.status_code == 202, r.text
            acknowledged.add(r.json()["documents"][0]["document_id"])
            i += 1
            time.sleep(0.02)

    db_url_used = str(api.services.db.url.render_as_string(hide_password=False))
    thread = threading.Thread(target=uploader)
    thread.start()
    kills = 0
    try:
        for _ in range(CYCLES):
            proc = spawn_worker(db_url_used, tmp_path / "data")
            time.sleep(rng.uniform(0.8, 2.0))
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            kills += 1
    finally:
        stop.set()
        thread.join()
    assert kills == CYCLES
    # One last worker drains the queue (killed leases expire after a second).
    proc = spawn_worker(db_url_used, tmp_path / "data")
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            with api.services.db.read() as s:
                pending = s.scalar(
                    select(func.count())
                    .select_from(IngestJob)
                    .where(IngestJob.state.in_(("queued", "running")))
                )
            if pending == 0:
                break
            time.sleep(0.2)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    result = verify_exactly_once(api.services.db, acknowledged)
    assert result["acknowledged"] > 20
    assert result == {
        "acknowledged": len(acknowledged),
        "lost": 0,
        "duplicated": 0,
        "extra_jobs": 0,
    }
