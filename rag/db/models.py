"""Tables: the system of record. Every schema change goes through an Alembic migration.

Times are UTC epoch seconds (float) so lease arithmetic is the same on SQLite and PostgreSQL.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Float,
    ForeignKey,
    ForeignKeyConstraint,
    Index,
    Integer,
    LargeBinary,
    String,
    Text,
    text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

# SQLite only auto-increments an INTEGER PRIMARY KEY.
BigId = BigInteger().with_variant(Integer(), "sqlite")


def new_id() -> str:
    return uuid.uuid4().hex


def now() -> float:
    return time.time()


class Base(DeclarativeBase):
    pass


class Tenant(Base):
    __tablename__ = "tenants"

    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=new_id)
    name: Mapped[str] = mapped_column(String(200), unique=True)
    created_at: Mapped[float] = mapped_column(Float, default=now)


class ApiKey(Base):
    __tablename__ = "api_keys"

    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=new_id)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"))
    # sha256 of the key; the key itself is shown once and never stored.
    key_hash: Mapped[str] = mapped_column(String(64), unique=True)
    prefix: Mapped[str] = mapped_column(String(16))
    is_admin: Mapped[bool] = mapped_column(Boolean, default=False)
    created_at: Mapped[float] = mapped_column(Float, default=now)
    revoked_at: Mapped[float | None] = mapped_column(Float, nullable=True)


class Collection(Base):
    __tablename__ = "collections"
    __table_args__ = (
        Index(
            "uq_collections_tenant_name_live",
            "tenant_id",
            "name",
            unique=True,
            sqlite_where=text("deleted_at IS NULL"),
            postgresql_where=text("deleted_at IS NULL"),
        ),
    )

    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=new_id)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"), index=True)
    name: Mapped[str] = mapped_column(String(200))
    description: Mapped[str] = mapped_column(Text, default="")
    embedding_model: Mapped[str] = mapped_column(String(200))
    embedding_dim: Mapped[int] = mapped_column(Integer)
    chunk_tokens: Mapped[int] = mapped_column(Integer)
    chunk_overlap: Mapped[int] = mapped_column(Integer)
    index_kind: Mapped[str] = mapped_column(String(40), default="auto")
    index_params: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    search_defaults: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    # The last `rag tune` measurements (the recall/latency curve), for the console.
    tuning: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    created_at: Mapped[float] = mapped_column(Float, default=now)
    deleted_at: Mapped[float | None] = mapped_column(Float, nullable=True)


class Blob(Base):
    """Uploaded bytes, stored under their tenant and sha256 in the same transaction as the
    document. One copy per tenant: a tenant's bytes can be erased without asking whether
    another tenant uploaded the same file, and an upload's timing says nothing about what
    other tenants hold."""

    __tablename__ = "blobs"

    tenant_id: Mapped[str] = mapped_column(
        ForeignKey("tenants.id", ondelete="CASCADE"), primary_key=True
    )
    sha256: Mapped[str] = mapped_column(String(64), primary_key=True)
    size: Mapped[int] = mapped_column(BigInteger)
    data: Mapped[bytes] = mapped_column(LargeBinary)
    created_at: Mapped[float] = mapped_column(Float, default=now)


class Document(Base):
    __tablename__ = "documents"
    __table_args__ = (
        # The same bytes in the same collection are one document (while it is live).
        Index(
            "uq_documents_collection_sha_live",
            "collection_id",
            "sha256",
            unique=True,
            sqlite_where=text("deleted_at IS NULL"),
            postgresql_where=text("deleted_at IS NULL"),
        ),
        Index("ix_documents_collection_created", "collection_id", "created_at", "id"),
        # Covers a collection's counts (documents by status, chunks): without it, summing
        # chunk_count reads every document row past its text (docs/decisions.md, 2026-11-30).
        Index(
            "ix_documents_collection_counts",
            "collection_id",
            "deleted_at",
            "status",
            "chunk_count",
        ),
        # The document's bytes: its tenant's copy of the blob.
        ForeignKeyConstraint(
            ["tenant_id", "sha256"], ["blobs.tenant_id", "blobs.sha256"], name="fk_documents_blob"
        ),
    )

    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=new_id)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"), index=True)
    collection_id: Mapped[str] = mapped_column(ForeignKey("collections.id", ondelete="CASCADE"))
    filename: Mapped[str] = mapped_column(String(255))
    media_type: Mapped[str] = mapped_column(String(100))
    sha256: Mapped[str] = mapped_column(String(64))
    size: Mapped[int] = mapped_column(BigInteger)
    # queued -> parsing -> embedding -> indexed | failed; deleted is a tombstone.
    status: Mapped[str] = mapped_column(String(20), default="queued")
    error: Mapped[str | None] = mapped_column(Text, nullable=True)
    meta: Mapped[dict[str, Any]] = mapped_column("metadata", JSON, default=dict)
    # The text the chunks' character offsets point into.
    text: Mapped[str | None] = mapped_column(Text, nullable=True)
    chunk_count: Mapped[int] = mapped_column(Integer, default=0)
    created_at: Mapped[float] = mapped_column(Float, default=now)
    updated_at: Mapped[float] = mapped_column(Float, default=now)
    indexed_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    deleted_at: Mapped[float | None] = mapped_column(Float, nullable=True)


class Chunk(Base):
    __tablename__ = "chunks"
    __table_args__ = (
        Index("ix_chunks_document_ordinal", "document_id", "ordinal"),
        # SQLite hands a purged highest id out again without AUTOINCREMENT; the indexes key
        # vectors and "remove" entries by id, so a reused id loses a live vector (0008).
        {"sqlite_autoincrement": True},
    )

    # The integer id is the label the vector index stores; never reused.
    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    # Deterministic (document id, ordinal, span): re-running a job cannot double a chunk.
    uid: Mapped[str] = mapped_column(String(64), unique=True)
    document_id: Mapped[str] = mapped_column(ForeignKey("documents.id", ondelete="CASCADE"))
    collection_id: Mapped[str] = mapped_column(
        ForeignKey("collections.id", ondelete="CASCADE"), index=True
    )
    tenant_id: Mapped[str] = mapped_column(String(32))
    ordinal: Mapped[int] = mapped_column(Integer)
    text: Mapped[str] = mapped_column(Text)
    start_char: Mapped[int] = mapped_column(Integer)
    end_char: Mapped[int] = mapped_column(Integer)
    token_count: Mapped[int] = mapped_column(Integer)
    # float32, little-endian, `embedding_dim` values, L2-normalised.
    embedding: Mapped[bytes] = mapped_column(LargeBinary)
    embedding_model: Mapped[str] = mapped_column(String(200))
    created_at: Mapped[float] = mapped_column(Float, default=now)


class IngestJob(Base):
    __tablename__ = "ingest_jobs"
    __table_args__ = (
        Index("ix_ingest_jobs_claim", "state", "run_after"),
        # A claim takes each tenant's oldest due jobs in turn; a tenant's pending jobs are
        # counted against its limit at every upload.
        Index("ix_ingest_jobs_tenant_claim", "tenant_id", "state", "run_after"),
        # ... starting with the tenant served least recently (its latest change).
        Index("ix_ingest_jobs_tenant_updated", "tenant_id", "updated_at"),
    )

    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=new_id)
    tenant_id: Mapped[str] = mapped_column(String(32))
    collection_id: Mapped[str] = mapped_column(String(32))
    document_id: Mapped[str] = mapped_column(ForeignKey("documents.id", ondelete="CASCADE"))
    # queued -> running -> done | failed
    state: Mapped[str] = mapped_column(String(20), default="queued")
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    max_attempts: Mapped[int] = mapped_column(Integer, default=5)
    # How many jobs the current lease was claimed with: a worker that dies holding several
    # leaves no clue which one killed it, so none of them is charged the attempt.
    claimed_with: Mapped[int] = mapped_column(Integer, default=1, server_default="1")
    run_after: Mapped[float] = mapped_column(Float, default=now)
    lease_owner: Mapped[str | None] = mapped_column(String(64), nullable=True)
    lease_expires_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    error: Mapped[str | None] = mapped_column(Text, nullable=True)
    created_at: Mapped[float] = mapped_column(Float, default=now)
    updated_at: Mapped[float] = mapped_column(Float, default=now)
    finished_at: Mapped[float | None] = mapped_column(Float, nullable=True)


class ChangeLog(Base):
    """What the vector indexes catch up from: seq > a snapshot's watermark.

    Writers lock the collection row first, so within a collection seq order is commit order.
    """

    __tablename__ = "change_log"
    __table_args__ = (
        Index("ix_change_log_collection_seq", "collection_id", "seq"),
        # The purge finds (and drops) a document's entries.
        Index("ix_change_log_document", "document_id"),
        # A reused seq would sit under an index's watermark and never be applied (0008).
        {"sqlite_autoincrement": True},
    )

    seq: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    collection_id: Mapped[str] = mapped_column(String(32))
    # "add" or "remove". Every chunk that leaves the record gets a "remove" (at the delete, or
    # at the purge for a deleted collection's chunks); "add" entries of purged chunks are
    # dropped with them. Entries hold ids only, never content.
    op: Mapped[str] = mapped_column(String(10))
    chunk_id: Mapped[int] = mapped_column(BigInteger)
    document_id: Mapped[str] = mapped_column(String(32))
    created_at: Mapped[float] = mapped_column(Float, default=now)


class MilvusCollection(Base):
    """Which Milvus collection serves a collection of kind "milvus" (rag.db.milvus_collections).
    No foreign key: the row outlives a purged collection until its Milvus collection is
    dropped."""

    __tablename__ = "milvus_collections"

    collection_id: Mapped[str] = mapped_column(String(32), primary_key=True)
    # The Milvus collection searches use (None until the first build completes).
    name: Mapped[str | None] = mapped_column(String(255), nullable=True)
    params: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    # The last change-log seq applied to `name`.
    watermark: Mapped[int] = mapped_column(BigInteger, default=0)
    # A Milvus collection being filled by a rebuild, and when it started (a claim: replicas
    # that see it wait for that build instead of starting their own).
    building: Mapped[str | None] = mapped_column(String(255), nullable=True)
    build_started_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    updated_at: Mapped[float] = mapped_column(Float, default=now)


class Conversation(Base):
    """A conversation over one collection, owned by the key that created it (its tenant's
    admin keys may list and delete it too). Its text lives in its turns; `bytes` sums them
    for the tenant's quota. A delete tombstones it; the purge erases it (rag.db.purge)."""

    __tablename__ = "conversations"
    __table_args__ = (
        Index("ix_conversations_collection_updated", "collection_id", "updated_at", "id"),
        Index("ix_conversations_tenant", "tenant_id", "deleted_at"),
    )

    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=new_id)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"))
    collection_id: Mapped[str] = mapped_column(ForeignKey("collections.id", ondelete="CASCADE"))
    key_id: Mapped[str] = mapped_column(String(32))  # the key that created it
    turn_count: Mapped[int] = mapped_column(Integer, default=0)
    # Turns erased because a document they cited was deleted.
    erased_turns: Mapped[int] = mapped_column(Integer, default=0)
    bytes: Mapped[int] = mapped_column(BigInteger, default=0)
    created_at: Mapped[float] = mapped_column(Float, default=now)
    updated_at: Mapped[float] = mapped_column(Float, default=now)
    deleted_at: Mapped[float | None] = mapped_column(Float, nullable=True)


class ConversationTurn(Base):
    """One question and its answer, with what it searched, its citations, and the documents
    its passages came from (`ConversationSource`: a deleted document erases the turn)."""

    __tablename__ = "conversation_turns"
    __table_args__ = (
        Index("ix_conversation_turns_conversation", "conversation_id", "ordinal"),
        {"sqlite_autoincrement": True},
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    conversation_id: Mapped[str] = mapped_column(ForeignKey("conversations.id", ondelete="CASCADE"))
    ordinal: Mapped[int] = mapped_column(Integer)
    question: Mapped[str] = mapped_column(Text)
    searched_query: Mapped[str] = mapped_column(Text)
    answer: Mapped[str] = mapped_column(Text)
    answer_source: Mapped[str] = mapped_column(String(20))
    finish_reason: Mapped[str] = mapped_column(String(20))
    citations: Mapped[list[dict[str, Any]]] = mapped_column(JSON, default=list)
    bytes: Mapped[int] = mapped_column(BigInteger, default=0)
    created_at: Mapped[float] = mapped_column(Float, default=now)


class ConversationSource(Base):
    """A document a turn's passages came from: the purge of that document erases the turn."""

    __tablename__ = "conversation_sources"
    __table_args__ = (Index("ix_conversation_sources_document", "document_id"),)

    turn_id: Mapped[int] = mapped_column(
        ForeignKey("conversation_turns.id", ondelete="CASCADE"), primary_key=True
    )
    document_id: Mapped[str] = mapped_column(String(32), primary_key=True)


class Answer(Base):
    """One answer as it was given (rag.quality): what feedback, the quality series, drift
    and unanswered topics are computed from. Erased with its collection, with any document
    it retrieved (answer_documents), with the conversation it was a turn of, and after
    quality.retention_days."""

    __tablename__ = "answers"
    __table_args__ = (
        Index("ix_answers_collection_created", "collection_id", "created_at"),
        Index("ix_answers_created", "created_at"),
        Index("ix_answers_conversation", "conversation_id"),
    )

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(String(32))
    collection_id: Mapped[str] = mapped_column(String(32))
    # The stored conversation the answer was a turn of (None: none).
    conversation_id: Mapped[str | None] = mapped_column(String(32), nullable=True)
    created_at: Mapped[float] = mapped_column(Float, default=now)
    # None when quality.store_questions is off.
    question: Mapped[str | None] = mapped_column(Text, nullable=True)
    # float32, little-endian, L2-normalised: the query vector retrieval used.
    question_embedding: Mapped[bytes | None] = mapped_column(LargeBinary, nullable=True)
    answer: Mapped[str] = mapped_column(Text, default="")
    # The passages given to the model (or quoted), [1] first: chunk row ids.
    chunk_ids: Mapped[list[int]] = mapped_column(JSON, default=list)
    # The knobs and sampling settings used.
    settings: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    answer_source: Mapped[str] = mapped_column(String(20))
    finish_reason: Mapped[str] = mapped_column(String(20))
    mode: Mapped[str] = mapped_column(String(20), default="generate")
    # The top retrieved passage's dense score, and its gap to the second's.
    top_score: Mapped[float | None] = mapped_column(Float, nullable=True)
    score_gap: Mapped[float | None] = mapped_column(Float, nullable=True)
    unsupported: Mapped[int] = mapped_column(Integer, default=0)
    first_token_ms: Mapped[float | None] = mapped_column(Float, nullable=True)
    latency_ms: Mapped[float] = mapped_column(Float, default=0.0)
    # Refused, or answered from a top passage below quality.advanced.weak_score.
    weak: Mapped[bool] = mapped_column(Boolean, default=False)


class AnswerDocument(Base):
    """The documents an answer retrieved: deleting any of them erases the answer."""

    __tablename__ = "answer_documents"
    __table_args__ = (Index("ix_answer_documents_document", "document_id"),)

    answer_id: Mapped[str] = mapped_column(
        ForeignKey("answers.id", ondelete="CASCADE"), primary_key=True
    )
    document_id: Mapped[str] = mapped_column(String(32), primary_key=True)


class Feedback(Base):
    """A rating of an answer: one per answer and API key (a later one replaces it)."""

    __tablename__ = "feedback"
    __table_args__ = (Index("ix_feedback_collection_created", "collection_id", "created_at"),)

    answer_id: Mapped[str] = mapped_column(
        ForeignKey("answers.id", ondelete="CASCADE"), primary_key=True
    )
    key_id: Mapped[str] = mapped_column(String(32), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(String(32))
    collection_id: Mapped[str] = mapped_column(String(32))
    rating: Mapped[str] = mapped_column(String(4))  # up | down
    comment: Mapped[str | None] = mapped_column(Text, nullable=True)
    correct_answer: Mapped[str | None] = mapped_column(Text, nullable=True)
    correct_document_id: Mapped[str | None] = mapped_column(String(32), nullable=True)
    created_at: Mapped[float] = mapped_column(Float, default=now)


class DriftWindow(Base):
    """The reference window of a collection's question drift: embeddings only (no text),
    kept past the answers' retention; a row goes when its answer is erased for a deleted
    document, and all of them with the collection."""

    __tablename__ = "drift_windows"

    collection_id: Mapped[str] = mapped_column(String(32), primary_key=True)
    answer_id: Mapped[str] = mapped_column(String(40), primary_key=True)
    embedding: Mapped[bytes] = mapped_column(LargeBinary)
    top_score: Mapped[float | None] = mapped_column(Float, nullable=True)
    refused: Mapped[bool] = mapped_column(Boolean, default=False)
    asked_at: Mapped[float] = mapped_column(Float, default=now)


class DriftState(Base):
    """The last drift test of a collection, by kind ("questions" or "content"): what
    /metrics, the quality route and the console show, the same on every replica."""

    __tablename__ = "drift_state"

    collection_id: Mapped[str] = mapped_column(String(32), primary_key=True)
    kind: Mapped[str] = mapped_column(String(10), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(String(32))
    score: Mapped[float] = mapped_column(Float, default=0.0)  # statistic / threshold
    statistic: Mapped[float] = mapped_column(Float, default=0.0)
    threshold: Mapped[float] = mapped_column(Float, default=0.0)
    alert: Mapped[bool] = mapped_column(Boolean, default=False)
    streak: Mapped[int] = mapped_column(Integer, default=0)  # tests past the threshold running
    # questions: answers counted at the last test; content: the last chunk id tested.
    mark: Mapped[int] = mapped_column(BigInteger, default=0)
    pinned: Mapped[bool] = mapped_column(Boolean, default=False)
    details: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    updated_at: Mapped[float] = mapped_column(Float, default=now)
