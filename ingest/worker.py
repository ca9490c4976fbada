"""The worker loop: claim a job with a lease, keep the lease alive while working, finish or
retry. Runs as `rag worker`, or as a thread inside `rag serve`."""

from __future__ import annotations

import logging
import os
import socket
import threading
import uuid

from ingest import jobs
from ingest.jobs import ClaimedJob, LeaseLost
from ingest.pipeline import PermanentFailure, Pipeline
from rag.config import IngestSettings
from rag.db import Database

log = logging.getLogger(__name__)


class _Heartbeat:
    """Renews a job's lease every third of its length until stopped."""

    def __init__(self, db: Database, job: ClaimedJob, lease_s: float) -> None:
        self.db, self.job, self.lease_s = db, job, lease_s
        self.lost = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"lease-{job.id[:8]}", daemon=True)

    def __enter__(self) -> _Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self.lease_s / 3):
            try:
                if not jobs.renew(self.db, self.job, self.lease_s):
                    self.lost.set()
                    return
            except Exception:  # a database hiccup: try again next beat
                log.exception("job %s: lease renewal failed", self.job.id)

    def check(self) -> None:
        if self.lost.is_set():
            raise LeaseLost(self.job.id)


class Worker:
    def __init__(
        self, db: Database, pipeline: Pipeline, settings: IngestSettings, owner: str | None = None
    ) -> None:
        self.db = db
        self.pipeline = pipeline
        self.settings = settings
        self.owner = owner or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
        self.wake = threading.Event()
        self.processed = 0

    def run_once(self) -> bool:
        """Claim and process one job. False when there was none."""
        job = jobs.claim(self.db, self.owner, self.settings.lease_s)
        if job is None:
            return False
        log.info("job %s: attempt %d of %d", job.id, job.attempt, job.max_attempts)
        try:
            with _Heartbeat(self.db, job, self.settings.lease_s) as beat:
                try:
                    self.pipeline.run(job, beat.check)
                except LeaseLost:
                    raise
                except PermanentFailure as exc:
                    self._fail(job, str(exc), permanent=True)
                except Exception as exc:
                    log.exception("job %s: attempt %d failed", job.id, job.attempt)
                    self._fail(job, f"{type(exc).__name__}: {exc}", permanent=False)
        except LeaseLost:
            log.warning("job %s: lease lost; another worker owns it now", job.id)
        self.processed += 1
        return True

    def _fail(self, job: ClaimedJob, reason: str, *, permanent: bool) -> None:
        state = jobs.fail(
            self.db,
            job,
            reason[:2000],
            permanent=permanent,
            backoff_base_s=self.settings.backoff_base_s,
            backoff_max_s=self.settings.backoff_max_s,
        )
        log.info("job %s: %s", job.id, state)

    def run(self, stop: threading.Event) -> None:
        log.info("worker %s started", self.owner)
        while not stop.is_set():
            try:
                busy = self.run_once()
            except Exception:
                # The database went away for a moment; the worker itself stays up.
                log.exception("worker %s: claim failed", self.owner)
                busy = False
            if not busy:
                self.wake.wait(self.settings.poll_interval_s)
                self.wake.clear()
        log.info("worker %s stopped", self.owner)

    def start_thread(self, stop: threading.Event) -> threading.Thread:
        thread = threading.Thread(target=self.run, args=(stop,), name="ingest-worker", daemon=True)
        thread.start()
        return thread
