from __future__ import annotations

from fastapi import APIRouter, Response

from rag.api.deps import CurrentPrincipal, ServicesDep
from rag.api.schemas import (
    CollectionCreate,
    CollectionList,
    CollectionOut,
    IndexInfo,
    RebuildIn,
    SearchDefaultsIn,
)
from rag.db import collections
from rag.index import build_index

router = APIRouter(prefix="/v1/collections", tags=["collections"])


@router.post("", status_code=201, response_model=CollectionOut)
def create_collection(
    body: CollectionCreate, services: ServicesDep, principal: CurrentPrincipal
) -> CollectionOut:
    ingest = services.settings.ingest
    tokens = body.chunking.tokens or ingest.chunk_tokens
    tokens = min(tokens, services.embedder.max_tokens)
    overlap = body.chunking.overlap if body.chunking.overlap is not None else ingest.chunk_overlap
    overlap = min(overlap, tokens // 2)
    if body.index.kind != "auto":
        # Refuse unknown build parameters now, not at the first search.
        build_index(body.index.kind, services.embedder.dim, dict(body.index.params))
    with services.db.write() as session:
        c = collections.create(
            session,
            principal.tenant_id,
            name=body.name,
            description=body.description,
            embedding_model=services.embedder.model_id,
            embedding_dim=services.embedder.dim,
            chunk_tokens=tokens,
            chunk_overlap=overlap,
            index_kind=body.index.kind,
            index_params=dict(body.index.params),
            search_defaults={},
        )
        return CollectionOut.of(c)


@router.get("", response_model=CollectionList)
def list_collections(services: ServicesDep, principal: CurrentPrincipal) -> CollectionList:
    with services.db.read() as session:
        out = [
            CollectionOut.of(
                c,
                collections.document_counts(session, c.id),
                collections.chunk_count(session, c.id),
            )
            for c in collections.list_live(session, principal.tenant_id)
        ]
    return CollectionList(collections=out)


@router.get("/{collection_id}", response_model=CollectionOut)
def get_collection(
    collection_id: str, services: ServicesDep, principal: CurrentPrincipal
) -> CollectionOut:
    with services.db.read() as session:
        c = collections.get(session, principal.tenant_id, collection_id)
        return CollectionOut.of(
            c, collections.document_counts(session, c.id), collections.chunk_count(session, c.id)
        )


@router.delete("/{collection_id}", status_code=204)
def delete_collection(
    collection_id: str, services: ServicesDep, principal: CurrentPrincipal
) -> Response:
    with services.db.write() as session:
        collections.delete(session, principal.tenant_id, collection_id)
    return Response(status_code=204)


@router.put("/{collection_id}/search-defaults", response_model=CollectionOut)
def set_search_defaults(
    collection_id: str,
    body: SearchDefaultsIn,
    services: ServicesDep,
    principal: CurrentPrincipal,
) -> CollectionOut:
    """The knobs a search uses when the request leaves them out (`rag tune --apply` sets
    these from measurements)."""
    with services.db.write() as session:
        c = collections.get(session, principal.tenant_id, collection_id, lock=True)
        collections.set_search_defaults(session, c, body.model_dump(exclude_none=True))
        return CollectionOut.of(c)


@router.post("/{collection_id}/index/rebuild", status_code=202, response_model=IndexInfo)
def rebuild_index(
    collection_id: str, body: RebuildIn, services: ServicesDep, principal: CurrentPrincipal
) -> IndexInfo:
    """Rebuild the collection's index from SQL, optionally into another kind, in the
    background; searches keep using the old one until the new one is swapped in."""
    with services.db.write() as session:
        c = collections.get(session, principal.tenant_id, collection_id, lock=True)
        kind = body.kind or c.index_kind
        params = (
            body.params
            if body.params is not None
            else (c.index_params if kind == c.index_kind else {})
        )
        if kind != "auto":
            build_index(kind, services.embedder.dim, dict(params))
        collections.set_index_spec(session, c, kind, params)
    services.indexes.rebuild(collection_id, None if kind == "auto" else kind, dict(params))
    state = services.indexes.state(collection_id)
    return IndexInfo(
        kind=state.kind,
        count=state.count,
        watermark=state.watermark,
        building=state.building,
        stale=state.stale,
    )
