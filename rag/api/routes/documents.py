from __future__ import annotations

import asyncio
import json
from typing import Annotated, Any

from fastapi import Path, Query, Request, Response
from starlette.datastructures import UploadFile

from rag.api.body import Router
from rag.api.deps import CurrentPrincipal, PoolsDep, ServicesDep
from rag.api.openapi import AUTHENTICATED, document, errors
from rag.api.schemas import (
    MAX_META_KEYS,
    AcceptedDocument,
    ChunkList,
    ChunkOut,
    DocumentList,
    DocumentOut,
    TextDocumentIn,
    TextDocumentsIn,
    UploadAccepted,
)
from rag.db import chunks, documents
from rag.errors import Invalid, TooLarge, UnsupportedMediaType
from rag.services import Services
from rag.upload.accept import Incoming, accept
from rag.upload.detect import safe_filename

router = Router(tags=["documents"], responses=AUTHENTICATED)

UPLOAD_PATH = "/v1/collections/{collection_id}/documents"
CollectionId = Annotated[str, Path(max_length=64)]
DocumentId = Annotated[str, Path(max_length=64)]
document(TextDocumentIn, TextDocumentsIn)

_FILES = {
    "type": "array",
    "items": {"type": "string", "format": "binary", "minLength": 1},
    "minItems": 1,
    "maxItems": 100,
}
UPLOAD_DOC = {
    "requestBody": {
        "content": {
            "multipart/form-data": {
                "schema": {
                    "type": "object",
                    "properties": {
                        "files": _FILES,
                        "metadata": {
                            "type": "object",
                            "description": "given to every file of the request",
                            "maxProperties": MAX_META_KEYS,
                            "propertyNames": {"minLength": 1, "maxLength": 100},
                            "additionalProperties": {
                                "anyOf": [
                                    {"type": "string", "maxLength": 400},
                                    {"type": "number", "minimum": -1e300, "maximum": 1e300},
                                    {"type": "boolean"},
                                    {"type": "null"},
                                ]
                            },
                        },
                    },
                    "required": ["files"],
                    "additionalProperties": False,
                },
                "encoding": {"metadata": {"contentType": "application/json"}},
            },
            "application/json": {
                "schema": {
                    "oneOf": [
                        {"$ref": "#/components/schemas/TextDocumentIn"},
                        {"$ref": "#/components/schemas/TextDocumentsIn"},
                    ]
                }
            },
        },
        "required": True,
    }
}


@router.post(
    UPLOAD_PATH,
    status_code=202,
    response_model=UploadAccepted,
    openapi_extra=UPLOAD_DOC,
    responses=errors(403, 404, 413, 415),
)
async def upload(
    collection_id: CollectionId,
    request: Request,
    services: ServicesDep,
    principal: CurrentPrincipal,
    pools: PoolsDep,
) -> UploadAccepted:
    """Upload one or many files (multipart field `files`, optional JSON `metadata`), or text
    as JSON. 202 means durable: each document will end `indexed` or `failed`. The key is
    checked before the body is read."""
    limit = services.settings.ingest.max_upload_bytes
    ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if ctype == "multipart/form-data":
        incoming = await _read_multipart(request, services, limit)
    elif ctype == "application/json":
        # Up to the upload limit of JSON: parsed on a thread, never on the event loop.
        incoming = await asyncio.to_thread(_read_json, await request.body(), limit)
    else:
        raise UnsupportedMediaType(
            "send multipart/form-data (field 'files') or application/json ({'text': ...})"
        )
    accepted = await pools.db.run(
        lambda: accept(
            services.db, principal.tenant_id, collection_id, incoming,
            max_attempts=services.settings.ingest.max_attempts,
            quota=services.settings.quota,
        )
    )  # fmt: skip
    services.wake_workers()
    return UploadAccepted(documents=[AcceptedDocument.of(a) for a in accepted])


async def _read_multipart(request: Request, services: Services, limit: int) -> list[Incoming]:
    max_files = services.settings.ingest.max_files_per_request
    try:
        form = await request.form(max_files=max_files, max_fields=20)
    except TooLarge:
        raise
    except Exception as exc:  # starlette reports bad multipart as a generic error
        raise Invalid(f"malformed multipart body: {exc}") from None
    try:
        meta = _parse_meta(form.get("metadata"))
        unknown = set(form.keys()) - {"files", "metadata"}
        if unknown:
            raise Invalid(f"unknown form fields: {sorted(unknown)[:8]}")
        uploads = list(form.getlist("files"))
        if not uploads:
            raise Invalid("no files: send them in the multipart field 'files'")
        out = []
        for upload in uploads:
            if not isinstance(upload, UploadFile):
                raise Invalid("'files' must be file parts, not text fields")
            data = await upload.read(limit + 1)
            if len(data) > limit:
                raise TooLarge(
                    f"{safe_filename(upload.filename)} is larger than the {limit} byte limit"
                )
            out.append(Incoming(safe_filename(upload.filename), data, upload.content_type, meta))
        return out
    finally:
        await form.close()


def _parse_meta(raw: object) -> dict[str, Any]:
    if raw is None:
        return {}
    if not isinstance(raw, str):
        raise Invalid("metadata must be a JSON object in a text field")
    try:
        meta = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise Invalid(f"metadata is not valid JSON: {exc.msg}") from None
    return _check_meta(meta)


def _check_meta(meta: object) -> dict[str, Any]:
    """What TextDocumentIn.metadata says, for metadata that comes as a form field."""
    if not isinstance(meta, dict):
        raise Invalid("metadata must be a JSON object")
    if len(meta) > MAX_META_KEYS:
        raise Invalid(f"metadata has more than {MAX_META_KEYS} keys")
    for key, value in meta.items():
        if not isinstance(key, str) or not key or len(key) > 100:
            raise Invalid("metadata keys must be strings of 1-100 characters")
        if not isinstance(value, (str, int, float, bool, type(None))):
            raise Invalid(f"metadata value for {key!r} must be a string, number or boolean")
        if isinstance(value, str) and len(value) > 400:
            raise Invalid(f"metadata value for {key!r} is longer than 400 characters")
        if _out_of_range(value):
            raise Invalid(f"metadata value for {key!r} is out of range")
    return meta


def _out_of_range(value: object) -> bool:
    """A number JSON readers would not agree on (NaN and infinities among them)."""
    if isinstance(value, bool) or not isinstance(value, float | int):
        return False
    return not -1e300 <= value <= 1e300


def _read_json(raw: bytes, limit: int) -> list[Incoming]:
    try:
        payload = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise Invalid(f"malformed JSON: {exc}") from None
    docs = (
        TextDocumentsIn.model_validate(payload).documents
        if isinstance(payload, dict) and "documents" in payload
        else [TextDocumentIn.model_validate(payload)]
    )
    out = []
    for d in docs:
        data = d.text.encode("utf-8")
        if len(data) > limit:
            raise TooLarge(f"text is larger than the {limit} byte limit")
        default = "document.md" if d.media_type == "text/markdown" else "document.txt"
        name = safe_filename(d.filename) if d.filename else default
        out.append(Incoming(name, data, d.media_type or "text/plain", _check_meta(d.metadata)))
    return out


@router.get(UPLOAD_PATH, response_model=DocumentList, responses=errors(404))
async def list_documents(
    collection_id: CollectionId,
    services: ServicesDep,
    principal: CurrentPrincipal,
    pools: PoolsDep,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    cursor: Annotated[str | None, Query(max_length=200)] = None,
    status: Annotated[str | None, Query(max_length=20)] = None,
) -> DocumentList:
    def page() -> DocumentList:
        with services.db.read() as session:
            docs, next_cursor = documents.list_page(
                session,
                principal.tenant_id,
                collection_id,
                limit=limit,
                cursor=cursor,
                status=status,
            )
            return DocumentList(
                documents=[DocumentOut.of(d) for d in docs], next_cursor=next_cursor
            )

    return await pools.db.run(page)


@router.get("/v1/documents/{document_id}", response_model=DocumentOut, responses=errors(404))
async def get_document(
    document_id: DocumentId, services: ServicesDep, principal: CurrentPrincipal, pools: PoolsDep
) -> DocumentOut:
    def one() -> DocumentOut:
        with services.db.read() as session:
            return DocumentOut.of(documents.get(session, principal.tenant_id, document_id))

    return await pools.db.run(one)


@router.get("/v1/documents/{document_id}/chunks", response_model=ChunkList, responses=errors(404))
async def list_chunks(
    document_id: DocumentId,
    services: ServicesDep,
    principal: CurrentPrincipal,
    pools: PoolsDep,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    offset: Annotated[int, Query(ge=0, le=10**9)] = 0,
) -> ChunkList:
    def page() -> ChunkList:
        with services.db.read() as session:
            rows = chunks.list_page(
                session, principal.tenant_id, document_id, limit=limit, offset=offset
            )
            return ChunkList(chunks=[ChunkOut.of(c) for c in rows], offset=offset, limit=limit)

    return await pools.db.run(page)


@router.delete(
    "/v1/documents/{document_id}",
    status_code=204,
    response_class=Response,
    responses=errors(404),
)
async def delete_document(
    document_id: DocumentId, services: ServicesDep, principal: CurrentPrincipal, pools: PoolsDep
) -> Response:
    """Tombstone at once: from this answer on the document is in no result or answer."""

    def delete() -> None:
        with services.db.write() as session:
            documents.delete(session, principal.tenant_id, document_id)

    await pools.db.run(delete)
    return Response(status_code=204)
