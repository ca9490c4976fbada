"""An exactly-once audit of ingestion: every acknowledged document indexed, no chunk twice.

Used by the chaos test and `bench/chaos_ingest.py`; an operator can run it after an incident.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterable
from dataclasses import asdict, dataclass

from sqlalchemy import func, select

from rag.db import Database
from rag.db.models import ChangeLog, Chunk, Document, IngestJob


@dataclass(frozen=True)
class Audit:
    acknowledged: int
    indexed: int
    lost: int
    duplicated: int
    extra_jobs: int

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


def audit(db: Database, acknowledged: Iterable[str]) -> Audit:
    """`lost`: acknowledged but not indexed. `duplicated`: a document whose chunks, chunk
    count or change-log entries disagree (a chunk written twice)."""
    ack = set(acknowledged)
    with db.read() as s:
        status = dict(s.execute(select(Document.id, Document.status)).all())
        counts = dict(s.execute(select(Document.id, Document.chunk_count)).all())
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
        jobs = dict(
            s.execute(
                select(IngestJob.document_id, func.count()).group_by(IngestJob.document_id)
            ).all()
        )
    indexed = sum(1 for d in ack if status.get(d) == "indexed")
    duplicated = sum(
        1
        for doc_id, n, distinct in chunk_rows
        if n != distinct or n != counts.get(doc_id) or adds.get(doc_id) != n
    )
    return Audit(
        acknowledged=len(ack),
        indexed=indexed,
        lost=len(ack) - indexed,
        duplicated=duplicated,
        extra_jobs=sum(1 for n in jobs.values() if n != 1),
    )


def pending_jobs(db: Database) -> int:
    with db.read() as s:
        return int(
            s.scalar(
                select(func.count())
                .select_from(IngestJob)
                .where(IngestJob.state.in_(("queued", "running")))
            )
            or 0
        )


def spawn_worker(db_url: str, data_dir: str, **settings: str) -> subprocess.Popen[bytes]:
    """Start `rag worker` as a separate process (for chaos drills: it gets SIGKILLed).

    `settings` are extra RAG_* variables, e.g. RAG_INGEST__ADVANCED__LEASE_S="1.0". The worker's log
    goes to `workers.log` in the data directory, for the post-mortem of a failed drill."""
    env = {
        **os.environ,
        "RAG_DATABASE__URL": db_url,
        "RAG_DATA_DIR": data_dir,
        "RAG_LOG_LEVEL": "WARNING",
        **settings,
    }
    os.makedirs(data_dir, exist_ok=True)
    with open(os.path.join(data_dir, "workers.log"), "ab") as log_file:
        return subprocess.Popen(
            [sys.executable, "-m", "rag.cli", "worker"],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=log_file,
        )
