"""Settings of what answers: asking, keys, the API, answer quality and metrics."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, SecretStr, model_validator

from rag.config._base import Section
from rag.deprecated import Upgrading

# Settings removed in this release: still accepted (and ignored) with a warning, for one
# release, so a deployment that sets one keeps starting (CHANGELOG.md).
REMOVED_ASK = {
    "prompt": "the legacy prompt is gone",
    "attribution": "whole-answer attribution is gone; answers are attributed by sentence",
    "evidence_coverage": "replaced by ask.advanced.min_support (RAG_ASK__ADVANCED__MIN_SUPPORT)",
    "extract_min_support": "replaced by ask.advanced.min_support (RAG_ASK__ADVANCED__MIN_SUPPORT)",
}

REMOVED_API = {"page_size_max": "it was never read"}


class AskAdvanced(Section):
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


class AskSettings(Section, Upgrading):
    path = "ask"
    removed = REMOVED_ASK

    # A passage must score at least this (cosine of the dense side) to be worth answering from;
    # below it the answer says the documents do not contain it, without running the generator.
    relevance_threshold: float = Field(0.2, ge=-1.0, le=1.0)
    default_k: int = Field(5, ge=1, le=200)
    # The keyword (BM25) side's weight in the passages an answer reads, when neither the
    # request nor the collection sets `hybrid` (searches stay dense: search.* has none).
    # Plan, tier, city and product names, and codes, are what a dense vector blurs between
    # near-duplicates and what the keyword side matches exactly (bench/answers.py).
    hybrid: float = Field(0.2, ge=0, le=1)
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
    # model's space, whole or with the subject taken out of both (rag.answer.evidence).
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


class AuthSettings(Section):
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


class ApiAdvanced(Section):
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
    # many of its own. None: half the CPU cores, at least 1.
    tenant_threads: int | None = Field(None, ge=1, le=1024)
    # A tenant's 429s from its lines answered at most this many a second, after a burst of
    # as many; the next waits its turn, still one of its requests in progress (rag.api.limits).
    refusals_per_s: float = Field(10.0, gt=0, le=1_000_000)
    # Requests outside /v1 (no key: probes, /metrics, the console) from one client address
    # answered at most this many a second, after a burst of as many; the next waits its turn.
    probes_per_s: float = Field(200.0, gt=0, le=1_000_000)
    # How often a long poll looks at its job: first after `long_poll_first_s`, then less
    # and less often (x1.5 a time) up to `long_poll_every_s`.
    long_poll_first_s: float = Field(0.1, gt=0)
    long_poll_every_s: float = Field(1.0, gt=0)
    # How long an idle keep-alive connection stays open. Longer than clients keep theirs
    # (httpx 5 s): when the server closes first, a request sent at that moment finds the
    # connection gone and fails without an answer.
    keep_alive_s: int = Field(75, ge=1, le=3600)


class ApiSettings(Section, Upgrading):
    path = "api"
    removed = REMOVED_API

    host: str = "127.0.0.1"
    port: int = Field(8000, ge=1, le=65535)
    long_poll_max_s: float = Field(60.0, gt=0)
    # JSON bodies of every route but the upload (which takes ingest.max_upload_mb): refused
    # with 413 as soon as more than this has streamed in.
    max_json_body_kb: int = Field(1024, ge=16, le=65_536)
    # Long polls (GET /v1/jobs/{id}?wait=...) held at once; beyond it 429.
    max_long_polls: int = Field(256, ge=1, le=100_000)
    # Requests of one tenant in progress at once (long polls and streams included); beyond
    # it 429 at once, before the request is read.
    tenant_requests: int = Field(64, ge=1, le=100_000)
    advanced: ApiAdvanced = ApiAdvanced()

    @property
    def max_json_body_bytes(self) -> int:
        return self.max_json_body_kb * 1024


class DriftAdvanced(Section):
    """The drift test's statistics: chosen by bench/drift.py."""

    # A test runs after this many new questions of a collection (and at most every
    # `interval_s`, in the quality loop of every process).
    check_every: int = Field(50, ge=1, le=10_000)
    permutations: int = Field(200, ge=20, le=5000)
    # The permutation quantile a statistic must pass, in `consecutive` tests running.
    alpha: float = Field(0.01, gt=0, lt=0.5)
    consecutive: int = Field(2, ge=1, le=20)


class DriftSettings(Section, Upgrading):
    """Question drift: a recent window of question embeddings against a reference window
    (the first `reference_size` questions of a collection, or a window an operator pins),
    by a kernel two-sample test (MMD, RBF kernel) with a permutation threshold
    (rag.quality.drift). Chosen by bench/drift.py; see docs/quality.md."""

    path = "quality.drift"

    reference_size: int = Field(200, ge=20, le=2000)
    window: int = Field(200, ge=20, le=2000)
    # Content drift: chunks newly ingested into a collection, tested against a sample of
    # the chunks it held before, once at least this many are new.
    content_min_new: int = Field(30, ge=5, le=100_000)
    advanced: DriftAdvanced = DriftAdvanced()


class QualityAdvanced(Section):
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


class QualitySettings(Section, Upgrading):
    """Answer records, feedback, quality signals, drift and unanswered topics
    (rag.quality; README "Quality you can watch")."""

    path = "quality"

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


class MetricsSettings(Section):
    # Off: no timings, no counters, and /metrics answers 404 (request ids stay on).
    enabled: bool = True
    # /metrics needs an admin key unless this is set (for a scraper on a private network).
    public: bool = False
    # /readyz answers from a result this recent (a probe from anyone costs no query then).
    readyz_cache_s: float = Field(default=2.0, ge=0)
