"""The worker loop: claim a job with a lease, keep the lease alive while working, finish or
retry. Runs as `rag worker`, or as a thread inside `rag serve`."""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from typing import TypeVar

from ingest.pipeline import PermanentFailure, Pipeline
from rag.config import IngestSettings
from rag.db import Database, jobs, transient
from rag.db.jobs import ClaimedJob, LeaseLost

log = logging.getLogger(__name__)

T = TypeVar("T")
# A claim runs this long before the worker looks for other tenants' jobs at its pauses.
PAUSE_AFTER_S = 2.0


class _Heartbeat:
    """Renews the leases of the jobs in hand every third of the lease until stopped."""

    def __init__(self, db: Database, held: list[ClaimedJob], lease_s: float) -> None:
        self.db, self.held, self.lease_s = db, held, lease_s
        self.lost: set[str] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="lease-heartbeat", daemon=True)

    def __enter__(self) -> _Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self.lease_s / 3):
            for job in self.held:
                if job.id in self.lost:
                    continue
                try:
                    if not jobs.renew(self.db, job, self.lease_s):
                        self.lost.add(job.id)
                except Exception:  # a database hiccup: try again next beat
                    log.exception("job %s: lease renewal failed", job.id)

    def checker(self, job: ClaimedJob) -> Callable[[], None]:
        def check() -> None:
            if job.id in self.lost:
                raise LeaseLost(job.id)

        return check


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
        with _Heartbeat(self.db, held, self.settings.lease_s) as beat:
            self.pipeline.run(held, self._guard, beat.checker, pause)
        self.processed += len(held)

    def _claim_batch(self, exclude_tenants: list[str] | None = None) -> list[ClaimedJob]:
        return jobs.claim_many(
            self.db, self.owner, self.settings.lease_s, self.settings.claim_batch,
            self.settings.claim_bytes, exclude_tenants=exclude_tenants or (),
        )  # fmt: skip

    def _guard(self, job: ClaimedJob, step: Callable[[], T]) -> T | None:
        """Run one job's step; its failure fails (or retries) that job alone."""
        try:
            return self._through_outages(job, step)
        except LeaseLost:
            log.warning("job %s: lease lost; another worker owns it now", job.id)
        except PermanentFailure as exc:
            self._fail_quietly(job, str(exc), permanent=True)
        except Exception as exc:
            log.exception("job %s: attempt %d failed", job.id, job.attempt)
            self._fail_quietly(job, f"{type(exc).__name__}: {exc}", permanent=False)
        return None

    def _through_outages(self, job: ClaimedJob, step: Callable[[], T]) -> T:
        """`step()`, run again after a pause while it meets transient database errors, for up
        to `transient_retry_s`: a database that is away for half a minute is nobody's failed
        attempt (each used to be one, and the backoff's first steps are short, so an outage
        used up every attempt and failed the document for good). The lease outlives the
        pauses (the heartbeat renews it once the database is back); steps are idempotent."""
        give_up = time.monotonic() + self.settings.transient_retry_s
        pause = 0.1
        while True:
            try:
                return step()
            except Exception as exc:
                if not transient(exc) or time.monotonic() + pause > give_up:
                    raise
                log.warning(
                    "job %s: transient database error (%s); again in %.1f s",
                    job.id, type(exc).__name__, pause,
                )  # fmt: skip
            time.sleep(pause)
            pause = min(2 * pause, 5.0)

    def _fail_quietly(self, job: ClaimedJob, reason: str, *, permanent: bool) -> None:
        try:
            self._through_outages(job, lambda: self._fail(job, reason, permanent=permanent))
        except LeaseLost:
            log.warning("job %s: lease lost before its failure was recorded", job.id)
        except Exception as exc:
            if not transient(exc):
                raise
            # Still unreachable: the lease lapses and the job is claimed again.
            log.warning("job %s: failure not recorded (%s)", job.id, type(exc).__name__)

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
                self.wake.wait(self.settings.poll_interval_s)
                self.wake.clear()
        log.info("worker %s stopped", self.owner)

    def start_thread(self, stop: threading.Event) -> threading.Thread:
        thread = threading.Thread(target=self.run, args=(stop,), name="ingest-worker", daemon=True)
        thread.start()
        return thread
