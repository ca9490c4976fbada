"""Every answer recorded off its path: a bounded queue and one writer thread.

`Recorder.record` builds the row (no I/O) and puts it on the queue without waiting: a full
queue drops the record and counts it, never the answer. The writer waits `flush_s` after
the first record it takes and writes what came meanwhile (at most `batch`) in one
transaction; a write that fails is logged and dropped (the answers were given; only their
record is lost). Feedback on an answer still queued waits for it (`wait_written`), so an id
the client already holds is never a 404 because the writer is behind.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from rag.background import Thread
from rag.db import Database
from rag.db import answers as sql
from rag.db.models import now

if TYPE_CHECKING:
    from rag.answer import AskRequest, Final, Prepared
    from rag.config import QualitySettings

log = logging.getLogger(__name__)


def new_id() -> str:
    return "ans_" + uuid.uuid4().hex


def build(
    answer_id: str,
    prep: Prepared,
    final: Final,
    req: AskRequest,
    settings: QualitySettings,
) -> sql.NewAnswer:
    """The row for one answer: what was asked, what was given, how it ended."""
    search = prep.search
    retrieved = search.passages if search is not None else []
    scores = sorted(
        (p.dense_score if p.dense_score is not None else p.score for p in retrieved), reverse=True
    )
    top = scores[0] if scores else None
    gap = scores[0] - scores[1] if len(scores) > 1 else None
    vector = search.query_vector if search is not None else None
    timings = final.timings_ms
    params = req.params
    used: dict[str, Any] = {
        "knobs": search.knobs_used() if search is not None else {},
        "mode": prep.mode,
        "evidence": req.evidence,
        "kv_reuse": req.kv_reuse,
        "max_tokens": params.max_tokens,
        "temperature": params.temperature,
        "top_p": params.top_p,
        "seed": params.seed,
        "budget_ms": req.budget_ms,
    }
    weak = final.answer_source == "refused" or top is None or top < settings.advanced.weak_score
    return sql.NewAnswer(
        id=answer_id,
        tenant_id=prep.tenant_id,
        collection_id=prep.collection_id,
        created_at=now(),
        question=req.question if settings.store_questions else None,
        question_embedding=vector.astype("<f4").tobytes() if vector is not None else None,
        answer=final.answer,
        chunk_ids=[p.chunk_id for p in prep.passages],
        # Every document retrieved, not only those given: deleting any erases the answer.
        document_ids=list(dict.fromkeys([p.document_id for p in (*prep.passages, *retrieved)])),
        settings=used,
        answer_source=final.answer_source,
        finish_reason=final.finish_reason,
        mode=prep.mode,
        top_score=top,
        score_gap=gap,
        unsupported=len(final.unsupported),
        first_token_ms=timings.get("first_token"),
        latency_ms=float(timings.get("total", 0.0)),
        weak=weak,
    )


class Recorder:
    def __init__(
        self,
        db: Database,
        settings: QualitySettings,
        *,
        write: Callable[[list[sql.NewAnswer]], None] | None = None,
    ) -> None:
        self.db = db
        self.settings = settings
        self._queue: queue.Queue[sql.NewAnswer] = queue.Queue(settings.advanced.queue)
        self._write = write or self._write_sql
        self._pending: set[str] = set()
        self._written = threading.Condition()
        self._loop = Thread("quality-writer", self._run)
        self.dropped = 0  # records the full queue (or a failed write) lost
        self.written = 0

    def record(self, row: sql.NewAnswer) -> bool:
        """Queue `row`; False (and counted) when the queue is full. Never blocks."""
        with self._written:
            self._pending.add(row.id)
        try:
            self._queue.put_nowait(row)
        except queue.Full:
            with self._written:
                self._pending.discard(row.id)
            self.dropped += 1
            return False
        return True

    def wait_written(self, answer_id: str, timeout_s: float = 5.0) -> None:
        """Return once `answer_id` is no longer queued (written, or dropped)."""
        deadline = time.monotonic() + timeout_s
        with self._written:
            while answer_id in self._pending:
                left = deadline - time.monotonic()
                if left <= 0:
                    return
                self._written.wait(left)

    def flush(self, timeout_s: float = 30.0) -> None:
        """Write everything queued now, and wait for what the writer holds (tests, shutdown)."""
        while self._drain():
            pass
        deadline = time.monotonic() + timeout_s
        with self._written:
            while self._pending and time.monotonic() < deadline:
                self._written.wait(deadline - time.monotonic())

    # ------------------------------------------------------------------ the writer

    def start(self) -> None:
        self._loop.start()

    def close(self) -> None:
        self._loop.close()
        self.flush()

    def _run(self) -> None:
        while not self._loop.stop.is_set():
            try:
                first = self._queue.get(timeout=self.settings.advanced.flush_s)
            except queue.Empty:
                continue
            # What arrives within `flush_s` of the first joins its transaction: one write per
            # interval under load, not one per answer.
            self._loop.stop.wait(self.settings.advanced.flush_s)
            self._drain([first])

    def _drain(self, batch: list[sql.NewAnswer] | None = None) -> bool:
        batch = batch or []
        while len(batch) < self.settings.advanced.batch:
            try:
                batch.append(self._queue.get_nowait())
            except queue.Empty:
                break
        if not batch:
            return False
        try:
            self._write(batch)
            self.written += len(batch)
        except Exception:
            self.dropped += len(batch)
            log.exception("could not record %d answers; they are dropped", len(batch))
        finally:
            with self._written:
                self._pending.difference_update(r.id for r in batch)
                self._written.notify_all()
        return True

    def _write_sql(self, batch: list[sql.NewAnswer]) -> None:
        with self.db.write() as session:
            sql.insert(session, batch)
