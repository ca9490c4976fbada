"""A batch of claimed jobs, top to bottom: load → parse → chunk (each job on its own) →
embed (one call for the whole batch) → write (one transaction, each job fenced on its lease).

One job's problem fails that job alone: each job's step runs in `_step`, which turns its
failure into a retry or a permanent failure (rag.db.jobs), while the rest of the batch goes
on. Embedding the chunks of up to `claim_batch` jobs together is what keeps ingest near the
model's bare encode speed.

A claim is bounded in bytes, not in the model's work: a megabyte of `[` is a million tokens.
So the batch is embedded in slices of `SLICE` chunks (sorted by length first, so slices pad
as little as one call would), and between jobs' parses and between slices the pipeline calls
the claim's `pause`, where the worker serves the other tenants waiting (ingest.worker).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import NoReturn, Protocol, TypeVar

import numpy as np
import numpy.typing as npt

from ingest.chunk import chunk_text
from ingest.isolate import parse_isolated
from ingest.parse import ParseLimits, parse
from rag.config import IngestSettings
from rag.db import Database, ingested, jobs, transient
from rag.db.ingested import ChunkRow
from rag.db.jobs import ClaimedJob, LeaseLost
from rag.embed import Embedder, split_rows
from rag.errors import ParseError, UnsupportedMediaType
from rag.upload import formats

log = logging.getLogger(__name__)

T = TypeVar("T")
# Chunks embedded between two pauses.
SLICE = 256


def _nothing() -> None:
    pass


class PermanentFailure(Exception):
    """Retrying cannot help (bad file, wrong model): the job ends `failed` at once."""


class Claim(Protocol):
    """A batch of jobs as the worker holds it: their leases kept alive while it is processed
    (ingest.worker)."""

    @property
    def jobs(self) -> list[ClaimedJob]: ...

    def still_ours(self, job: ClaimedJob) -> None:
        """Raise LeaseLost once another worker owns the job."""

    def pause(self) -> None:
        """A point where the worker may run other tenants' jobs first."""


@dataclass(frozen=True)
class Chunked:
    """A job parsed and chunked, waiting for its vectors."""

    text: str
    chunks: list[ChunkRow]


class Pipeline:
    def __init__(self, db: Database, embedder: Embedder, settings: IngestSettings) -> None:
        self.db = db
        self.embedder = embedder
        self.settings = settings
        self.limits = ParseLimits.from_settings(settings)

    def run(self, claim: Claim) -> None:
        """Process a claimed batch; `claim.pause()` between jobs' parses and embedded slices."""
        ready: list[tuple[ClaimedJob, Chunked]] = []
        for job in claim.jobs:
            log.info("job %s: attempt %d of %d", job.id, job.attempt, job.max_attempts)
            chunked = self._step(job, partial(self.chunk, job, partial(claim.still_ours, job)))
            if chunked is not None:
                ready.append((job, chunked))
            claim.pause()
        if not ready:
            return
        try:
            jobs.set_status(self.db, [job for job, _ in ready], "embedding")
        except Exception:  # only what the documents show meanwhile: the write sets the rest
            log.warning("could not mark %d jobs embedding", len(ready), exc_info=True)
        try:
            vectors = self.embed([c for _, c in ready], claim.pause)
        except Exception as exc:
            log.exception("embedding failed for %d jobs", len(ready))
            for job, _ in ready:
                self._step(job, partial(_raise, exc))
            return
        self.write(ready, vectors, claim)

    # ---------------------------------------------------------------- the stages

    def chunk(self, job: ClaimedJob, still_ours: Callable[[], None]) -> Chunked | None:
        """Load, parse and chunk one job. None when its document is gone (job cancelled)."""
        inp = jobs.load_input(self.db, job)
        if inp is None:
            jobs.cancel(self.db, job, "document deleted")
            return None
        if inp.embedding_model != self.embedder.model_id:
            raise PermanentFailure(
                f"collection embeds with {inp.embedding_model!r} but this worker runs "
                f"{self.embedder.model_id!r}"
            )
        text = self.parse(inp.data, inp.media_type)  # `parsing` was set when it was claimed
        still_ours()
        max_tokens = min(inp.chunk_tokens, self.embedder.max_tokens)
        overlap = min(inp.chunk_overlap, max_tokens // 2)
        max_chars = max_tokens * self.settings.advanced.chunk_chars_per_token
        spans = chunk_text(text, self.embedder.token_spans, max_tokens, overlap, max_chars)
        if not spans:
            raise PermanentFailure("the document contains no text")
        rows = [ChunkRow(s.ordinal, s.text, s.start_char, s.end_char, s.token_count) for s in spans]
        return Chunked(text, rows)

    def parse(self, data: bytes, media_type: str) -> str:
        try:
            if not formats.sandboxed(media_type):
                parsed = parse(data, media_type, self.limits)
            else:
                parsed = parse_isolated(data, media_type, self.limits)
        except (ParseError, UnsupportedMediaType) as exc:
            raise PermanentFailure(exc.message) from exc
        return parsed.text

    def embed(
        self, batch: list[Chunked], pause: Callable[[], None] = _nothing
    ) -> list[npt.NDArray[np.float32]]:
        """The chunks of several jobs, longest first in slices of `SLICE` (one encode call
        each, `pause()` between them), split back per job."""
        texts = [c.text for p in batch for c in p.chunks]
        order = sorted(range(len(texts)), key=lambda i: -len(texts[i]))
        parts = []
        for at in range(0, len(order), SLICE):
            if at:
                pause()
            parts.append(self.embedder.embed([texts[i] for i in order[at : at + SLICE]]))
        vectors = np.empty((len(texts), self.embedder.dim), np.float32)
        if parts:
            vectors[order] = np.vstack(parts)
        return split_rows(vectors, [len(p.chunks) for p in batch])

    def write(
        self,
        ready: list[tuple[ClaimedJob, Chunked]],
        vectors: list[npt.NDArray[np.float32]],
        claim: Claim,
    ) -> None:
        """The whole batch in one transaction; if that fails, each job on its own, so one
        job's problem fails that job alone."""
        batch = [
            ingested.Finished(job, c.text, c.chunks, v)
            for (job, c), v in zip(ready, vectors, strict=True)
        ]
        try:
            states = ingested.complete_many(self.db, batch, self.embedder.model_id)
        except Exception:
            log.exception("writing a batch of %d jobs failed; writing them one by one", len(batch))
            for item in batch:
                self._step(item.job, partial(self._write_one, item, claim))
            return
        for item in batch:
            state = states[item.job.id]
            if state == "lost":
                log.warning("job %s: lease lost; another worker owns it now", item.job.id)
            else:
                log.info("job %s: %s, %d chunks", item.job.id, state, len(item.chunks))

    def _write_one(self, item: ingested.Finished, claim: Claim) -> str:
        claim.still_ours(item.job)
        state = ingested.complete(
            self.db,
            item.job,
            text=item.text,
            chunks=item.chunks,
            vectors=item.vectors,
            embedding_model=self.embedder.model_id,
        )
        log.info("job %s: %s, %d chunks", item.job.id, state, len(item.chunks))
        return state

    # ---------------------------------------------------------------- one job's failure

    def _step(self, job: ClaimedJob, step: Callable[[], T]) -> T | None:
        """Run one job's step; its failure fails (or retries) that job alone, and gives None."""
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
        pauses (the worker's heartbeat renews it once the database is back); steps are
        idempotent."""
        give_up = time.monotonic() + self.settings.advanced.transient_retry_s
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
            backoff_base_s=self.settings.advanced.backoff_base_s,
            backoff_max_s=self.settings.advanced.backoff_max_s,
        )
        log.info("job %s: %s", job.id, state)


def _raise(exc: BaseException) -> NoReturn:
    raise exc
