"""Request and response bodies. Requests forbid unknown fields; tables stay in rag.db."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from rag.db.documents import Accepted
from rag.db.models import ApiKey, Chunk, Collection, Document, IngestJob


def iso(t: float | None) -> str | None:
    return None if t is None else datetime.fromtimestamp(t, UTC).isoformat()


MANY_UNKNOWN = 10


class Request(BaseModel):
    # Strict: a JSON type other than the one the schema states is refused, not coerced (0 is
    # not false, "5" is not 5).
    model_config = ConfigDict(extra="forbid", strict=True)

    @model_validator(mode="before")
    @classmethod
    def _few_unknown_fields(cls, data: object) -> object:
        # extra="forbid" makes one error per unknown key, built on the event loop: a body of
        # many made-up keys holds the loop meanwhile (bench/abuse.py's `validation_errors`
        # attack; its `loop_stall_max_ms`). Past a few, one error says it.
        fields = cls.model_fields  # a property: read once, not once a key
        if isinstance(data, dict) and len(data) > len(fields) + MANY_UNKNOWN:
            unknown = [k for k in data if k not in fields]
            if len(unknown) > MANY_UNKNOWN:
                shown = ", ".join(repr(k)[:40] for k in unknown[:5])
                raise ValueError(f"{len(unknown)} unknown fields ({shown}, ...)")
        return data

    @field_validator("*", mode="before")
    @classmethod
    def _integral_numbers(cls, v: object) -> object:
        # JSON has one number type: 5.0 is the integer 5 (JSON Schema agrees), which strict
        # ints would refuse; a float field takes the int as it is.
        return int(v) if isinstance(v, float) and v.is_integer() else v


# Bounds every request states in its schema (and so in /openapi.json).
Id = Annotated[str, Field(min_length=1, max_length=64, description="an id")]
MetaKey = Annotated[str, Field(min_length=1, max_length=100)]
# 32 keys of up to 100 characters with values of up to 400: at most 16,000 characters in all.
MetaText = Annotated[str, Field(max_length=400)]
# Numbers JSON readers everywhere agree on: integers a double holds exactly, finite floats.
INT_MAX = 2**53 - 1
Integer = Annotated[int, Field(ge=-INT_MAX, le=INT_MAX)]
# Text with a visible character and no control characters (names, tenants).
PRINTABLE = r"^[^\x00-\x1f]*[^\s\x00-\x1f][^\x00-\x1f]*$"
# Text with a visible character and no NUL (questions, queries).
NOT_BLANK = r"^[^\x00]*\S[^\x00]*$"
# A text document: a visible character, and no control characters but the whitespace ones
# and ESC (what upload detection takes for text).
TEXT_BODY = r"^[^\x00-\x08\x0e-\x1a\x1c-\x1f]*\S[^\x00-\x08\x0e-\x1a\x1c-\x1f]*$"
Real = Annotated[float, Field(ge=-1e300, le=1e300)]
MetaValue = MetaText | Integer | Real | bool
MAX_META_KEYS = 32
ParamName = Annotated[str, Field(min_length=1, max_length=64)]
ParamValue = Integer | Real | bool | Annotated[str, Field(max_length=64)] | None
# Index build parameters: each kind's own bounds are checked by rag.index.check_params.
IndexParams = Annotated[
    dict[ParamName, ParamValue],
    Field(max_length=16, description="build parameters of the index kind (see the README)"),
]


# ---------------------------------------------------------------- collections


class ChunkingIn(Request):
    tokens: int | None = Field(None, ge=16, le=512, description="chunk size in model tokens")
    overlap: int | None = Field(None, ge=0, le=256, description="tokens shared by neighbours")


IndexKind = Literal[
    "auto", "exact", "hnsw", "faiss_flat", "faiss_ivf", "faiss_ivf_sq8", "faiss_hnsw", "milvus"
]


class IndexIn(Request):
    kind: IndexKind = "auto"
    params: IndexParams = Field(default_factory=dict)


class CollectionCreate(Request):
    name: str = Field(min_length=1, max_length=200, pattern=PRINTABLE)
    description: str = Field("", max_length=2000)
    chunking: ChunkingIn = Field(default_factory=ChunkingIn)
    index: IndexIn = Field(default_factory=IndexIn)

    @field_validator("name", mode="before")
    @classmethod
    def _printable(cls, v: object) -> object:
        # Said in words before the pattern says it; the name is stored stripped.
        if not isinstance(v, str):
            return v
        if not v.strip() or any(ord(c) < 32 for c in v):
            raise ValueError("name must be non-empty printable text")
        return v.strip()


class CollectionOut(BaseModel):
    id: str
    name: str
    description: str
    embedding_model: str
    embedding_dim: int
    chunk_tokens: int
    chunk_overlap: int
    index_kind: str
    index_params: dict[str, Any]
    search_defaults: dict[str, Any]
    created_at: str | None
    documents: dict[str, int] = Field(default_factory=dict)
    chunks: int = 0

    @classmethod
    def of(
        cls, c: Collection, documents: dict[str, int] | None = None, chunks: int = 0
    ) -> CollectionOut:
        return cls(
            id=c.id,
            name=c.name,
            description=c.description,
            embedding_model=c.embedding_model,
            embedding_dim=c.embedding_dim,
            chunk_tokens=c.chunk_tokens,
            chunk_overlap=c.chunk_overlap,
            index_kind=c.index_kind,
            index_params=c.index_params or {},
            search_defaults=c.search_defaults or {},
            created_at=iso(c.created_at),
            documents=documents or {},
            chunks=chunks,
        )


class CollectionList(BaseModel):
    collections: list[CollectionOut]


# ---------------------------------------------------------------- documents


# The most text one JSON document may hold; the upload limit (ingest.max_upload_mb, in bytes
# of UTF-8) is usually the tighter bound.
MAX_TEXT_CHARS = 50 * 1024 * 1024


class TextDocumentIn(Request):
    text: str = Field(
        min_length=1,
        max_length=MAX_TEXT_CHARS,
        pattern=TEXT_BODY,
        description="the document's text",
    )
    filename: str | None = Field(None, max_length=255)
    media_type: Literal["text/plain", "text/markdown", "text/html"] | None = None
    metadata: dict[MetaKey, MetaValue | None] = Field(
        default_factory=dict, max_length=MAX_META_KEYS
    )

    @field_validator("text", mode="before")
    @classmethod
    def _not_blank(cls, v: object) -> object:
        # The pattern says as much; these say it in words (before the pattern does).
        if not isinstance(v, str):
            return v
        if not v.strip():
            raise ValueError("text is empty")
        if "\x00" in v:
            raise ValueError("text contains NUL characters")
        return v


class TextDocumentsIn(Request):
    documents: list[TextDocumentIn] = Field(min_length=1, max_length=1000)


class AcceptedDocument(BaseModel):
    document_id: str
    job_id: str | None
    filename: str
    media_type: str
    size: int
    status: str
    duplicate: bool
    requeued: bool = Field(
        False, description="the same bytes as a failed document, which is queued again (new job)"
    )

    @classmethod
    def of(cls, a: Accepted) -> AcceptedDocument:
        return cls(
            document_id=a.document.id,
            job_id=a.job.id if a.job else None,
            filename=a.document.filename,
            media_type=a.document.media_type,
            size=a.document.size,
            status=a.document.status,
            duplicate=a.duplicate,
            requeued=a.requeued,
        )


class UploadAccepted(BaseModel):
    documents: list[AcceptedDocument]


class DocumentOut(BaseModel):
    id: str
    collection_id: str
    filename: str
    media_type: str
    sha256: str
    size: int
    status: str
    error: str | None
    metadata: dict[str, Any]
    chunk_count: int
    created_at: str | None
    updated_at: str | None
    indexed_at: str | None

    @classmethod
    def of(cls, d: Document) -> DocumentOut:
        return cls(
            id=d.id,
            collection_id=d.collection_id,
            filename=d.filename,
            media_type=d.media_type,
            sha256=d.sha256,
            size=d.size,
            status=d.status,
            error=d.error,
            metadata=d.meta or {},
            chunk_count=d.chunk_count,
            created_at=iso(d.created_at),
            updated_at=iso(d.updated_at),
            indexed_at=iso(d.indexed_at),
        )


class DocumentList(BaseModel):
    documents: list[DocumentOut]
    next_cursor: str | None


class ChunkOut(BaseModel):
    id: str = Field(description="the chunk's opaque id, as search and answers give it")
    uid: str = Field(description="the same as id (kept for clients that read it)")
    document_id: str
    ordinal: int
    text: str
    start_char: int
    end_char: int
    token_count: int

    @classmethod
    def of(cls, c: Chunk) -> ChunkOut:
        return cls(
            id=c.uid,
            uid=c.uid,
            document_id=c.document_id,
            ordinal=c.ordinal,
            text=c.text,
            start_char=c.start_char,
            end_char=c.end_char,
            token_count=c.token_count,
        )


class ChunkList(BaseModel):
    chunks: list[ChunkOut]
    offset: int
    limit: int


# ---------------------------------------------------------------- jobs


class JobOut(BaseModel):
    id: str
    document_id: str
    collection_id: str
    state: str
    done: bool
    attempts: int
    max_attempts: int
    error: str | None
    created_at: str | None
    finished_at: str | None
    next_attempt_at: str | None

    @classmethod
    def of(cls, j: IngestJob) -> JobOut:
        done = j.state in ("done", "failed", "cancelled")
        return cls(
            id=j.id,
            document_id=j.document_id,
            collection_id=j.collection_id,
            state=j.state,
            done=done,
            attempts=j.attempts,
            max_attempts=j.max_attempts,
            error=j.error,
            created_at=iso(j.created_at),
            finished_at=iso(j.finished_at),
            next_attempt_at=iso(j.run_after) if j.state == "queued" else None,
        )


# ---------------------------------------------------------------- keys


class KeyCreate(Request):
    tenant: str = Field(min_length=1, max_length=200, pattern=PRINTABLE)
    admin: bool = False


class KeyCreated(BaseModel):
    key: str = Field(description="shown once; only its hash is stored")
    id: str = Field(description="the key's id, to revoke it with")
    tenant: str
    tenant_id: str


class KeyInfo(BaseModel):
    id: str
    prefix: str
    tenant_id: str
    is_admin: bool
    created_at: str | None
    revoked_at: str | None = None

    @classmethod
    def of(cls, k: ApiKey) -> KeyInfo:
        return cls(
            id=k.id,
            prefix=k.prefix,
            tenant_id=k.tenant_id,
            is_admin=k.is_admin,
            created_at=iso(k.created_at),
            revoked_at=iso(k.revoked_at),
        )


class Health(BaseModel):
    status: str
    version: str
