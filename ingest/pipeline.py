"""One job, top to bottom: load → parse → chunk → embed → write (one transaction)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from ingest import jobs
from ingest.chunk import chunk_text
from ingest.isolate import parse_isolated
from ingest.jobs import ChunkRow, ClaimedJob
from ingest.parse import ParseLimits, parse
from rag.config import IngestSettings
from rag.db import Database
from rag.embed import Embedder, split_rows
from rag.errors import ParseError, UnsupportedMediaType

log = logging.getLogger(__name__)

# Plain text needs no sandbox: decoding is bounded by the upload size limit.
IN_PROCESS_TYPES = {"text/plain", "text/markdown"}


class PermanentFailure(Exception):
    """Retrying cannot help (bad file, wrong model): the job ends `failed` at once."""


@dataclass(frozen=True)
class Prepared:
    """A job parsed and chunked, waiting for its vectors."""

    text: str
    chunks: list[ChunkRow]


class Pipeline:
    def __init__(self, db: Database, embedder: Embedder, settings: IngestSettings) -> None:
        self.db = db
        self.embedder = embedder
        self.settings = settings
        self.limits = ParseLimits.from_settings(settings)

    def run(self, job: ClaimedJob, still_ours: Callable[[], None]) -> str:
        """Process one claimed job. `still_ours` raises LeaseLost when the lease was lost."""
        prepared = self.prepare(job, still_ours)
        if prepared is None:
            return "cancelled"
        jobs.set_status(self.db, [job], "embedding")
        [vectors] = self.embed([prepared])
        return self.finish(job, prepared, vectors, still_ours)

    def prepare(self, job: ClaimedJob, still_ours: Callable[[], None]) -> Prepared | None:
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
        spans = chunk_text(text, self.embedder.token_spans, max_tokens, overlap)
        if not spans:
            raise PermanentFailure("the document contains no text")
        chunks = [
            ChunkRow(s.ordinal, s.text, s.start_char, s.end_char, s.token_count) for s in spans
        ]
        return Prepared(text, chunks)

    def embed(self, batch: list[Prepared]) -> list[npt.NDArray[np.float32]]:
        """One encode call for the chunks of several jobs (the model batches and sorts them by
        length itself), split back per job."""
        texts = [c.text for p in batch for c in p.chunks]
        return split_rows(self.embedder.embed(texts), [len(p.chunks) for p in batch])

    def finish(
        self,
        job: ClaimedJob,
        prepared: Prepared,
        vectors: npt.NDArray[np.float32],
        still_ours: Callable[[], None],
    ) -> str:
        still_ours()
        state = jobs.complete(
            self.db,
            job,
            text=prepared.text,
            chunks=prepared.chunks,
            vectors=vectors,
            embedding_model=self.embedder.model_id,
        )
        log.info("job %s: %s, %d chunks", job.id, state, len(prepared.chunks))
        return state

    def finish_many(
        self, batch: list[tuple[ClaimedJob, Prepared, npt.NDArray[np.float32]]]
    ) -> dict[str, str]:
        """Write a batch of jobs in one transaction; each is fenced on its own lease."""
        states = jobs.complete_many(
            self.db,
            [jobs.Finished(job, p.text, p.chunks, v) for job, p, v in batch],
            self.embedder.model_id,
        )
        for job, prepared, _ in batch:
            log.info("job %s: %s, %d chunks", job.id, states[job.id], len(prepared.chunks))
        return states

    def parse(self, data: bytes, media_type: str) -> str:
        try:
            if media_type in IN_PROCESS_TYPES:
                parsed = parse(data, media_type, self.limits)
            else:
                parsed = parse_isolated(data, media_type, self.limits)
        except (ParseError, UnsupportedMediaType) as exc:
            raise PermanentFailure(exc.message) from exc
        return parsed.text
