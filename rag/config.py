"""One Settings object, built at startup and passed down as typed sub-models.

Every option can be set from the environment with the prefix ``RAG_`` and ``__`` between
levels, for example ``RAG_DATABASE__URL`` or ``RAG_INGEST__MAX_UPLOAD_MB``. Unknown options
fail at startup.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from rag.deprecated import upgrade
from rag.engine.config import EngineSettings


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


class DatabaseSettings(_Section):
    # None means a SQLite file inside the data directory.
    url: str | None = None
    echo: bool = False


class EmbedAdvanced(_Section):
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


class EmbedSettings(_Section):
    @model_validator(mode="before")
    @classmethod
    def _upgrade(cls, data: Any) -> Any:
        return upgrade("embed", data, frozenset(EmbedAdvanced.model_fields), {})

    # "sentence-transformers" loads the bundled all-MiniLM-L6-v2 (or `model_path`);
    # "hash" is a deterministic, model-free embedder for tests and smoke runs.
    backend: Literal["sentence-transformers", "hash"] = "sentence-transformers"
    model_path: str | None = None
    device: Literal["auto", "cpu", "cuda"] = "auto"
    batch_size: int = Field(64, ge=1, le=4096)
    advanced: EmbedAdvanced = EmbedAdvanced()


class IngestSettings(_Section):
    max_upload_mb: float = Field(50.0, gt=0)
    max_files_per_request: int = Field(100, ge=1)
    max_text_chars: int = Field(5_000_000, ge=1)
    chunk_tokens: int = Field(200, ge=16, le=512)
    chunk_overlap: int = Field(32, ge=0, le=256)
    # Chunks are bounded in characters too, at this many a token: one token can be any
    # length (a 300,000-character word is one [UNK]). English runs ~4.5 a token.
    chunk_chars_per_token: int = Field(10, ge=4, le=100)
    # Parsing runs in a child process under these limits.
    parse_timeout_s: float = Field(60.0, gt=0)
    parse_memory_mb: int = Field(1024, ge=64)
    max_pages: int = Field(2000, ge=1)
    # Worker behaviour.
    in_process_worker: bool = True
    lease_s: float = Field(60.0, gt=0)
    # Jobs a worker takes at once: their chunks are embedded in one batch. A claim also
    # stops at claim_bytes of documents (one larger document is taken alone), so that one
    # tenant's large files never hold the worker long while another tenant's upload waits.
    claim_batch: int = Field(64, ge=1, le=256)
    claim_bytes: int = Field(1_048_576, ge=1)
    max_attempts: int = Field(5, ge=1)
    backoff_base_s: float = Field(2.0, ge=0)
    backoff_max_s: float = Field(300.0, ge=0)
    # A job's step that meets a transient database error (connection lost, server restarting,
    # database locked) runs again in place, pausing 0.1 s doubling to 5 s, for up to this
    # long; only then does it count as a failed attempt.
    transient_retry_s: float = Field(60.0, ge=0)
    poll_interval_s: float = Field(0.5, gt=0)
    # The nice value of worker threads (and of the parser children they start): ingest takes
    # the CPU that searches and answers leave. 0 keeps the process's priority.
    worker_nice: int = Field(10, ge=0, le=19)

    @property
    def max_upload_bytes(self) -> int:
        return int(self.max_upload_mb * 1024 * 1024)


class IndexSettings(_Section):
    # How often the background thread catches every open index up with the change log.
    catch_up_interval_s: float = Field(0.5, gt=0)
    # Write a new snapshot generation after this many changes.
    snapshot_every: int = Field(10_000, ge=1)
    keep_generations: int = Field(2, ge=1)


class MilvusSettings(_Section):
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


class PurgeSettings(_Section):
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


class QuotaSettings(_Section):
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


class ConversationSettings(_Section):
    """Stored conversations (rag.db.conversations)."""

    # A conversation untouched this long is erased by the purge (None: kept until deleted).
    retention_days: float | None = Field(None, gt=0)
    # Turns one conversation may hold; a turn past it is refused (409).
    max_turns: int = Field(200, ge=1, le=10_000)
    # Turns a listing returns at most; an /ask with a conversation reads the latest
    # ask.max_history_turns of them.
    page_size: int = Field(50, ge=1, le=500)


class SearchSettings(_Section):
    default_k: int = Field(10, ge=1)
    # The documented maximum k of one search.
    max_k: int = Field(200, ge=1, le=1000)
    max_query_chars: int = Field(4000, ge=1)
    # The budget when neither the request nor the collection sets one (None: no budget).
    default_budget_ms: float | None = Field(None, gt=0)


# Settings removed in this release: still accepted (and ignored) with a warning, for one
# release, so a deployment that sets one keeps starting (CHANGELOG.md).
REMOVED_ASK = {
    "prompt": "the legacy prompt is gone",
    "attribution": "whole-answer attribution is gone; answers are attributed by sentence",
    "evidence_coverage": "replaced by ask.advanced.min_support (RAG_ASK__ADVANCED__MIN_SUPPORT)",
    "extract_min_support": "replaced by ask.advanced.min_support (RAG_ASK__ADVANCED__MIN_SUPPORT)",
}


class AskAdvanced(_Section):
    """How grounded answers are generated and checked: chosen by measurement with the bundled
    model (bench/answers.py); a request's sampling fields override the penalties."""

    # Refuse unless the sentence that answers also holds this share of the question's
    # weighted terms (rag.answer.evidence; ask.min_similarity is the cosine floor).
    min_support: float = Field(0.0, ge=0, le=1)
    # The share of a request's budget retrieval may use; generation gets the rest.
    retrieve_share: float = Field(0.3, gt=0, lt=1)
    # The most tokens of the generated sentence that follows the quote (evidence "one").
    sentence_tokens: int = Field(48, ge=1, le=512)
    # OpenAI's penalties (counted over the answer's own tokens, so quoting a passage is not
    # punished), Hugging Face's repetition penalty, and the engine's guard that ends an answer
    # repeating itself (finish reason `repetition`).
    frequency_penalty: float = Field(0.5, ge=-2, le=2)
    presence_penalty: float = Field(0.0, ge=-2, le=2)
    repetition_penalty: float = Field(1.0, gt=0, le=4)
    stop_repetition: bool = True
    # After "[", only the numbers of the passages given (a logit mask): every marker is valid.
    cite_mask: bool = True
    # With cite_mask: a marker may name only the passages that best support the sentence it
    # closes (the most of its content words; rag.answer.cite.chooser); any given one when
    # none holds any.
    cite_steer: bool = True
    # Evidence "all": each sentence is cited by its marker, or attributed to the passage
    # holding at least this share of its content words, or reported unsupported.
    support_threshold: float = Field(0.5, ge=0, le=1)


class AskSettings(_Section):
    @model_validator(mode="before")
    @classmethod
    def _upgrade(cls, data: Any) -> Any:
        return upgrade("ask", data, frozenset(AskAdvanced.model_fields), REMOVED_ASK)

    # A passage must score at least this (cosine of the dense side) to be worth answering from;
    # below it the answer says the documents do not contain it, without running the generator.
    relevance_threshold: float = Field(0.2, ge=-1.0, le=1.0)
    default_k: int = Field(5, ge=1, le=200)
    default_max_tokens: int = Field(256, ge=1)
    max_tokens_limit: int = Field(4096, ge=1)
    max_question_chars: int = Field(4000, ge=1)
    # Plain chat: the most text all messages of one request may hold, checked before they are
    # tokenized (about a quarter as many tokens: the bundled model's context at the default);
    # requests can state at most 64,000.
    max_chat_chars: int = Field(32_000, ge=1, le=64_000)
    # The budget when the request sets none (None: no budget).
    default_budget_ms: float | None = Field(None, gt=0)
    # The most of the passage cache one warm-up (POST .../warm) may fill; a warm-up only ever
    # fills free room, never evicting what is cached (another tenant's passages included).
    warm_max_share: float = Field(0.25, gt=0, le=1)

    # Grounded answers (bench/answers.py measures them): "generate" answers with the quote
    # that supports it and the generator's sentence (`evidence`); "extractive" quotes the
    # sentences that answer, without the generator. A request's `mode`, then the
    # collection's saved default, win.
    mode: Literal["generate", "extractive"] = "generate"
    # What the generator sees: "one" passage (the one holding the sentence that answers; the
    # answer is that quote, then one generated sentence shown only when it agrees with it),
    # "all" the passages retrieved (the answer as the generator writes it, reviewed at the
    # end), "auto": "one" for the local engine, "all" for a remote one (a larger model).
    evidence: Literal["auto", "one", "all"] = "auto"
    # Refuse without the generator unless a sentence (or table row) of the passages holds
    # what the question asks for (a number, a date, a name) and, with its context, the
    # question's names, and has at least this cosine with the question in the embedding
    # model's space (rag.answer.evidence).
    min_similarity: float = Field(0.45, ge=-1, le=1)
    # Extractive answers: the sentence that answers, then the best others of its passage, at
    # most this many sentences and about this many words.
    extract_sentences: int = Field(1, ge=1, le=20)
    extract_words: int = Field(90, ge=1, le=2000)

    # Conversations (rag.answer.history): a follow-up ("When was it published?") is rewritten
    # into a stand-alone question before it is searched, unless a request says
    # `rewrite: false`. The history one request may carry (earlier turns, and their
    # questions' and answers' characters in all; 413 past either), and the turns the prompt
    # carries after the passages (the oldest dropped first, also to fit the context).
    rewrite: bool = True
    max_history_turns: int = Field(20, ge=0, le=1000)
    max_history_chars: int = Field(20_000, ge=0, le=1_000_000)
    prompt_turns: int = Field(2, ge=0, le=100)
    prompt_turn_chars: int = Field(1500, ge=0, le=100_000)
    advanced: AskAdvanced = AskAdvanced()


class AuthSettings(_Section):
    # When unset, an admin key is generated on first start and written to
    # <data_dir>/admin-key (readable by its owner only). Setting a new one revokes the one set
    # before and the generated one. At least 16 characters.
    admin_key: SecretStr | None = None
    # How long a key that resolved is trusted without asking the database again (a key
    # revoked on another replica keeps working here for at most this long); 0: always ask.
    key_cache_s: float = Field(1.0, ge=0)

    @model_validator(mode="after")
    def _long_enough(self) -> AuthSettings:
        # The key is a secret: the message says how long it is, never what it is.
        if self.admin_key is not None and len(self.admin_key.get_secret_value()) < 16:
            raise ValueError(
                f"auth.admin_key (RAG_AUTH__ADMIN_KEY) has "
                f"{len(self.admin_key.get_secret_value())} characters; it needs at least 16 "
                "(choose a long random secret, e.g. `openssl rand -base64 32`)"
            )
        return self


class ApiAdvanced(_Section):
    """How the API's threads are shared and long polls paced: tuning, measured by bench/abuse.py."""

    # The service's own threads for the blocking work of requests (rag.api.pools): searches,
    # other database work (listings, collections, documents, jobs) and key lookups. A request
    # that finds its kind's threads busy waits in its tenant's line (tenants take turns); it
    # gets 429 at once when `thread_queue` requests wait, or `tenant_queue` of its tenant's.
    search_threads: int = Field(8, ge=1, le=1024)
    db_threads: int = Field(8, ge=1, le=1024)
    auth_threads: int = Field(4, ge=1, le=1024)
    thread_queue: int = Field(64, ge=0, le=100_000)
    tenant_queue: int = Field(16, ge=0, le=100_000)
    # Of the search and database threads, how many one tenant's requests may hold at once
    # (the others wait in its line): a tenant's flood then shares the cores with at most this
    # many of its own. None: half the CPU cores, at least 2.
    tenant_threads: int | None = Field(None, ge=1, le=1024)
    # How often a long poll looks at its job: first after `long_poll_first_s`, then less
    # and less often (x1.5 a time) up to `long_poll_every_s`.
    long_poll_first_s: float = Field(0.1, gt=0)
    long_poll_every_s: float = Field(1.0, gt=0)


class ApiSettings(_Section):
    @model_validator(mode="before")
    @classmethod
    def _upgrade(cls, data: Any) -> Any:
        removed = {"page_size_max": "it was never read"}
        return upgrade("api", data, frozenset(ApiAdvanced.model_fields), removed)

    host: str = "127.0.0.1"
    port: int = Field(8000, ge=1, le=65535)
    long_poll_max_s: float = Field(60.0, gt=0)
    # JSON bodies of every route but the upload (which takes ingest.max_upload_mb): refused
    # with 413 as soon as more than this has streamed in.
    max_json_body_kb: int = Field(1024, ge=16, le=65_536)
    # Long polls (GET /v1/jobs/{id}?wait=...) held at once; beyond it 429.
    max_long_polls: int = Field(256, ge=1, le=100_000)
    advanced: ApiAdvanced = ApiAdvanced()

    @property
    def max_json_body_bytes(self) -> int:
        return self.max_json_body_kb * 1024


class DriftAdvanced(_Section):
    """The drift test's statistics: chosen by bench/drift.py."""

    # A test runs after this many new questions of a collection (and at most every
    # `interval_s`, in the quality loop of every process).
    check_every: int = Field(50, ge=1, le=10_000)
    permutations: int = Field(200, ge=20, le=5000)
    # The permutation quantile a statistic must pass, in `consecutive` tests running.
    alpha: float = Field(0.01, gt=0, lt=0.5)
    consecutive: int = Field(2, ge=1, le=20)


class DriftSettings(_Section):
    """Question drift: a recent window of question embeddings against a reference window
    (the first `reference_size` questions of a collection, or a window an operator pins),
    by a kernel two-sample test (MMD, RBF kernel) with a permutation threshold
    (rag.quality.drift). Chosen by bench/drift.py; see docs/quality.md."""

    @model_validator(mode="before")
    @classmethod
    def _upgrade(cls, data: Any) -> Any:
        return upgrade("quality.drift", data, frozenset(DriftAdvanced.model_fields), {})

    reference_size: int = Field(200, ge=20, le=2000)
    window: int = Field(200, ge=20, le=2000)
    # Content drift: chunks newly ingested into a collection, tested against a sample of
    # the chunks it held before, once at least this many are new.
    content_min_new: int = Field(30, ge=5, le=100_000)
    advanced: DriftAdvanced = DriftAdvanced()


class QualityAdvanced(_Section):
    """How answer records are written and unanswered topics clustered: tuning, chosen by
    bench/quality_watch.py and bench/drift.py."""

    # Answers waiting to be written; past it a record is dropped (counted in
    # rag_quality_records_dropped), never the answer.
    queue: int = Field(10_000, ge=1, le=1_000_000)
    # The writer's batch: at most this many records, every `flush_s`.
    batch: int = Field(256, ge=1, le=10_000)
    flush_s: float = Field(0.2, gt=0, le=60)
    # An answered question counts as weak evidence when its top passage scores below this
    # (the dense cosine); refused questions always count. Both feed unanswered topics.
    weak_score: float = Field(0.35, ge=-1, le=1)
    # Unanswered topics: clusters closer than this mean cosine distance merge (average
    # linkage), over at most `topics_max_questions` of the most recent. Chosen by
    # bench/drift.py: a broad uncovered subject split into pieces at tighter cuts.
    topic_distance: float = Field(0.95, gt=0, lt=2)
    topics_max_questions: int = Field(2000, ge=10, le=20_000)


class QualitySettings(_Section):
    """Answer records, feedback, quality signals, drift and unanswered topics
    (rag.quality; README "Quality you can watch")."""

    @model_validator(mode="before")
    @classmethod
    def _upgrade(cls, data: Any) -> Any:
        return upgrade("quality", data, frozenset(QualityAdvanced.model_fields), {})

    # Off: no answer is recorded, answers carry no id, feedback is refused (404).
    enabled: bool = True
    # Off: the question's text is never stored (its embedding is): drift still works, and
    # unanswered topics show counts and nearest documents without example questions.
    store_questions: bool = True
    # Answers (and their feedback) older than this are erased by the purge loop.
    retention_days: float = Field(90.0, gt=0, le=36_500)
    # How often each process recomputes drift and unanswered topics of collections with new
    # answers (from SQL: every replica computes the same).
    interval_s: float = Field(15.0, gt=0)
    drift: DriftSettings = DriftSettings()
    advanced: QualityAdvanced = QualityAdvanced()


class MetricsSettings(_Section):
    # Off: no timings, no counters, and /metrics answers 404 (request ids stay on).
    enabled: bool = True
    # /metrics needs an admin key unless this is set (for a scraper on a private network).
    public: bool = False
    # /readyz answers from a result this recent (a probe from anyone costs no query then).
    readyz_cache_s: float = Field(default=2.0, ge=0)


class Settings(BaseSettings):
    # Errors name the option and what is wrong, never its value (secrets among them).
    model_config = SettingsConfigDict(
        env_prefix="RAG_",
        env_nested_delimiter="__",
        extra="forbid",
        env_file=None,
        hide_input_in_errors=True,
    )

    data_dir: Path = Path("./data")
    database: DatabaseSettings = DatabaseSettings()
    embed: EmbedSettings = EmbedSettings()
    ingest: IngestSettings = IngestSettings()
    index: IndexSettings = IndexSettings()
    milvus: MilvusSettings = MilvusSettings()
    search: SearchSettings = SearchSettings()
    purge: PurgeSettings = PurgeSettings()
    quota: QuotaSettings = QuotaSettings()
    conversations: ConversationSettings = ConversationSettings()
    engine: EngineSettings = EngineSettings()
    ask: AskSettings = AskSettings()
    auth: AuthSettings = AuthSettings()
    api: ApiSettings = ApiSettings()
    metrics: MetricsSettings = MetricsSettings()
    quality: QualitySettings = QualitySettings()
    log_level: str = "INFO"
    log_json: bool = False

    @model_validator(mode="after")
    def _overlap_below_size(self) -> Settings:
        if self.ingest.chunk_overlap >= self.ingest.chunk_tokens:
            raise ValueError("ingest.chunk_overlap must be smaller than ingest.chunk_tokens")
        return self

    @property
    def database_url(self) -> str:
        if self.database.url:
            return self.database.url
        return f"sqlite:///{(self.data_dir / 'rag.db').resolve()}"
