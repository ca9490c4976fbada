"""The worker loop: claim a batch of jobs with leases, keep the leases alive while the
pipeline runs them (it finishes, retries or fails each job), and at the pipeline's pauses
serve the other tenants waiting. Runs as `rag worker`, or as a thread inside `rag serve`."""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable

from ingest.pipeline import Pipeline
from rag.config import IngestSettings
from rag.db import Database, jobs
from rag.db.jobs import ClaimedJob, LeaseLost

log = logging.getLogger(__name__)

# A claim runs this long before the worker looks for other tenants' jobs at its pauses.
PAUSE_AFTER_S = 2.0


class _Claim:
    """A claimed batch in the pipeline's hands (ingest.pipeline.Claim): a thread renews the
    jobs' leases every third of the lease until it is closed, and `pause` is where the worker
    may serve other tenants first."""

    def __init__(
        self,
        db: Database,
        held: list[ClaimedJob],
        lease_s: float,
        on_pause: Callable[[], None] | None = None,
    ) -> None:
        self.db, self.jobs, self.lease_s, self.on_pause = db, held, lease_s, on_pause
        self.lost: set[str] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="lease-heartbeat", daemon=True)

    def __enter__(self) -> _Claim:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self.lease_s / 3):
            for job in self.jobs:
                if job.id in self.lost:
                    continue
                try:
                    if not jobs.renew(self.db, job, self.lease_s):
                        self.lost.add(job.id)
                except Exception:  # a database hiccup: try again next beat
                    log.exception("job %s: lease renewal failed", job.id)

    def still_ours(self, job: ClaimedJob) -> None:
        if job.id in self.lost:
            raise LeaseLost(job.id)

    def pause(self) -> None:
        if self.on_pause is not None:
            self.on_pause()


def lower_priority(nice: int) -> None:
    """Lower the calling thread's CPU priority by `nice` (Linux: a thread's nice value is its
    own, and the threads and processes it starts inherit it, so the torch team that embeds
    this thread's batches and the parser children run at it too). Searches and answers then
    take the cores first when both want them; alone, ingest still has the whole machine."""
    if nice <= 0 or not hasattr(os, "setpriority"):
        return
    try:
        tid = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + nice))
    except OSError as exc:  # not permitted here: run at the normal priority
        log.warning("could not lower the worker's priority: %s", exc)


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
        """Claim a batch of jobs (up to `claim_batch`), keep their leases alive, and run them
        through the pipeline. False when there was no job.

        A claim bounded in bytes can still be minutes of the model's work (a megabyte of `[`
        is a million tokens). So at the pipeline's pauses, once the claim has run
        `PAUSE_AFTER_S`, the worker claims the other tenants' due jobs and runs them first
        (not pausing them in turn), while the heartbeat keeps the paused claim's leases."""
        held = self._claim_batch()
        if not held:
            return False
        tenants = sorted({job.tenant_id for job in held})
        last = time.monotonic()

        def pause() -> None:
            nonlocal last
            if time.monotonic() - last < PAUSE_AFTER_S:
                return
            others = self._claim_batch(exclude_tenants=tenants)
            if others:
                log.info("claim of %d jobs paused for %d of other tenants", len(held), len(others))
                self._process(others)
            last = time.monotonic()

        self._process(held, pause)
        return True

    def _process(self, held: list[ClaimedJob], pause: Callable[[], None] | None = None) -> None:
        with _Claim(self.db, held, self.settings.advanced.lease_s, pause) as claim:
            self.pipeline.run(claim)
        self.processed += len(held)

    def _claim_batch(self, exclude_tenants: list[str] | None = None) -> list[ClaimedJob]:
        tuning = self.settings.advanced
        return jobs.claim_many(
            self.db, self.owner, tuning.lease_s, tuning.claim_batch, tuning.claim_bytes,
            exclude_tenants=exclude_tenants or (),
        )  # fmt: skip

    def run(self, stop: threading.Event) -> None:
        lower_priority(self.settings.worker_nice)
        log.info("worker %s started", self.owner)
        while not stop.is_set():
            try:
                busy = self.run_once()
            except Exception:
                # The database went away for a moment; the worker itself stays up.
                log.exception("worker %s: claim failed", self.owner)
                busy = False
            if not busy:
                self.wake.wait(self.settings.advanced.poll_interval_s)
                self.wake.clear()
        log.info("worker %s stopped", self.owner)

    def start_thread(self, stop: threading.Event) -> threading.Thread:
        thread = threading.Thread(target=self.run, args=(stop,), name="ingest-worker", daemon=True)
        thread.start()
        return thread
