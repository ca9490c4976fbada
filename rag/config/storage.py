"""Settings of what is stored and how it gets there: the database, embedding, ingest, the
indexes, Milvus, the purge, quotas, conversations and search."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, SecretStr

from rag.config._base import Section
from rag.deprecated import Upgrading


class DatabaseSettings(Section):
    # None means a SQLite file inside the data directory.
    url: str | None = None
    echo: bool = False


class EmbedAdvanced(Section):
    """How search queries are embedded on CPU: measured choices (bench/ttft.py,
    bench/query_priority.py), not options a deployment needs."""

    # ONNX Runtime threads that embed one batch of search queries on CPU (the torch fallback
    # runs one: see QueryLane).
    query_threads: int = Field(2, ge=1, le=256)
    # What embeds search queries on CPU: ONNX Runtime runs the same model faster than torch on
    # one short query (same vectors); "torch" skips the ONNX export at start.
    query_backend: Literal["onnxruntime", "torch"] = "onnxruntime"
    # The weights ONNX Runtime runs search queries in: "int8" (dynamic quantization) or
    # "float32"; "auto" is int8 (rag.embed.onnx.AUTO_FORMAT). Document vectors stay float32.
    # An int8 graph that cannot be built, or strays from float32, falls back to float32.
    query_format: Literal["auto", "float32", "int8"] = "auto"
    # Search queries before ingest on CPU: ingest embeds one batch (`batch_size` chunks) at a
    # time and, before each, waits while queries are being embedded, at most `ingest_yield_ms`
    # a batch (a steady stream of queries slows ingest down, never stops it).
    query_priority: bool = True
    ingest_yield_ms: float = Field(200.0, ge=0, le=60_000)
    # The dimension of the "hash" embedder.
    hash_dim: int = Field(384, ge=8, le=4096)


class EmbedSettings(Section, Upgrading):
    path = "embed"

    # "sentence-transformers" loads the bundled all-MiniLM-L6-v2 (or `model_path`);
    # "hash" is a deterministic, model-free embedder for tests and smoke runs.
    backend: Literal["sentence-transformers", "hash"] = "sentence-transformers"
    model_path: str | None = None
    device: Literal["auto", "cpu", "cuda"] = "auto"
    batch_size: int = Field(64, ge=1, le=4096)
    advanced: EmbedAdvanced = EmbedAdvanced()


class IngestAdvanced(Section):
    """How the worker claims, leases and retries jobs, and how long a chunk may run in
    characters: tuning (bench/ingest.py, bench/abuse.py), not options a deployment needs."""

    # Chunks are bounded in characters too, at this many a token: one token can be any
    # length (a 300,000-character word is one [UNK]). English runs ~4.5 a token.
    chunk_chars_per_token: int = Field(10, ge=4, le=100)
    # How long a claimed job stays the worker's without its lease being renewed.
    lease_s: float = Field(60.0, gt=0)
    # Jobs a worker takes at once: their chunks are embedded in one batch. A claim also
    # stops at claim_bytes of documents (one larger document is taken alone), so that one
    # tenant's large files never hold the worker long while another tenant's upload waits.
    claim_batch: int = Field(64, ge=1, le=256)
    claim_bytes: int = Field(1_048_576, ge=1)
    # A failed attempt waits backoff_base_s, doubling with each attempt, at most backoff_max_s.
    backoff_base_s: float = Field(2.0, ge=0)
    backoff_max_s: float = Field(300.0, ge=0)
    # A job's step that meets a transient database error (connection lost, server restarting,
    # database locked) runs again in place, pausing 0.1 s doubling to 5 s, for up to this
    # long; only then does it count as a failed attempt.
    transient_retry_s: float = Field(60.0, ge=0)
    # How often an idle worker looks for new jobs (an upload to this process wakes it at once).
    poll_interval_s: float = Field(0.5, gt=0)


class IngestSettings(Section, Upgrading):
    path = "ingest"

    max_upload_mb: float = Field(50.0, gt=0)
    max_files_per_request: int = Field(100, ge=1)
    max_text_chars: int = Field(5_000_000, ge=1)
    chunk_tokens: int = Field(200, ge=16, le=512)
    chunk_overlap: int = Field(32, ge=0, le=256)
    # Parsing runs in a child process under these limits.
    parse_timeout_s: float = Field(60.0, gt=0)
    parse_memory_mb: int = Field(1024, ge=64)
    max_pages: int = Field(2000, ge=1)
    # Worker behaviour.
    in_process_worker: bool = True
    # Attempts of a job before it fails for good.
    max_attempts: int = Field(5, ge=1)
    # The nice value of worker threads (and of the parser children they start): ingest takes
    # the CPU that searches and answers leave. 0 keeps the process's priority.
    worker_nice: int = Field(10, ge=0, le=19)
    advanced: IngestAdvanced = IngestAdvanced()

    @property
    def max_upload_bytes(self) -> int:
        return int(self.max_upload_mb * 1024 * 1024)


class IndexSettings(Section):
    # How often the background thread catches every open index up with the change log.
    catch_up_interval_s: float = Field(0.5, gt=0)
    # Write a new snapshot generation after this many changes.
    snapshot_every: int = Field(10_000, ge=1)
    keep_generations: int = Field(2, ge=1)


class MilvusSettings(Section):
    """Where collections of kind "milvus" keep their vectors: Milvus Standalone or Distributed
    (or `milvus-lite server`), spoken to over its gRPC API."""

    # e.g. http://milvus:19530; None: no collection may use kind "milvus".
    uri: str | None = None
    token: SecretStr | None = None  # "user:password" or an API key
    db_name: str = ""
    # Prefixed to every Milvus collection this service creates, so that several ragserve
    # installations (or test runs) can share one Milvus.
    collection_prefix: str = Field("ragserve", pattern=r"^[A-Za-z][A-Za-z0-9_]{0,31}$")
    # Strong: a chunk is searchable as soon as it is written (the in-process indexes'
    # behaviour); Bounded trades a second or so of staleness for lower search latency.
    consistency: Literal["Strong", "Bounded", "Session", "Eventually"] = "Strong"
    # The timeout of a search when the request has no budget, and of every other call.
    search_timeout_s: float = Field(10.0, gt=0)
    call_timeout_s: float = Field(60.0, gt=0)
    # Rows per insert while building or catching up.
    write_batch: int = Field(2000, ge=1, le=50_000)


class PurgeSettings(Section):
    """What a delete leaves behind is erased in rounds: within about `interval_s` (plus one
    round's work) a deleted document's rows, text, blob, full-text entries and vectors (in
    memory and in index snapshots) are gone, and on SQLite its bytes are out of the files."""

    enabled: bool = True
    interval_s: float = Field(60.0, gt=0)
    # Documents erased per transaction (a big collection goes over several).
    batch: int = Field(200, ge=1, le=10_000)
    # PostgreSQL: "vacuum" makes the space of deleted rows reusable (the bytes stay in the
    # table files until overwritten); "full" rewrites the tables so they leave the files too,
    # holding an exclusive lock on each table while it runs.
    postgres_vacuum: Literal["vacuum", "full"] = "vacuum"


class QuotaSettings(Section):
    """Per-tenant limits; None is unlimited. Quotas refuse with 403 (`quota_exceeded`), the
    load limits with 429 and Retry-After."""

    max_collections: int | None = Field(None, ge=0)
    max_documents: int | None = Field(None, ge=0)
    # Bytes of the tenant's live documents, as uploaded.
    max_storage_mb: float | None = Field(None, ge=0)
    # Ingest jobs queued or running: an upload beyond it is refused until the queue drains.
    max_pending_jobs: int | None = Field(None, ge=0)
    # Answers (ask, chat completions) being prepared or generated at once, per API process.
    max_concurrent_asks: int | None = Field(None, ge=1)
    # Stored conversations (POST .../conversations), and the bytes of their turns' text.
    max_conversations: int | None = Field(None, ge=0)
    max_conversation_mb: float | None = Field(None, ge=0)


class ConversationSettings(Section):
    """Stored conversations (rag.db.conversations)."""

    # A conversation untouched this long is erased by the purge (None: kept until deleted).
    retention_days: float | None = Field(None, gt=0)
    # Turns one conversation may hold; a turn past it is refused (409).
    max_turns: int = Field(200, ge=1, le=10_000)
    # Turns a listing returns at most; an /ask with a conversation reads the latest
    # ask.max_history_turns of them.
    page_size: int = Field(50, ge=1, le=500)


class SearchSettings(Section):
    default_k: int = Field(10, ge=1)
    # The documented maximum k of one search.
    max_k: int = Field(200, ge=1, le=1000)
    max_query_chars: int = Field(4000, ge=1)
    # The budget when neither the request nor the collection sets one (None: no budget).
    default_budget_ms: float | None = Field(None, gt=0)
