from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Response

from rag import quota as quotas
from rag.api.deps import CurrentPrincipal, PoolsDep, ServicesDep
from rag.api.openapi import AUTHENTICATED, errors
from rag.api.schemas import (
    CollectionCreate,
    CollectionList,
    CollectionOut,
    IndexInfo,
    RebuildIn,
    SearchDefaultsIn,
)
from rag.db import collections
from rag.index import check_params

router = APIRouter(prefix="/v1/collections", tags=["collections"], responses=AUTHENTICATED)

CollectionId = Annotated[str, Path(max_length=64)]


@router.post("", status_code=201, response_model=CollectionOut, responses=errors(403, 409, 413))
async def create_collection(
    body: CollectionCreate, services: ServicesDep, principal: CurrentPrincipal, pools: PoolsDep
) -> CollectionOut:
    ingest = services.settings.ingest
    tokens = body.chunking.tokens or ingest.chunk_tokens
    tokens = min(tokens, services.embedder.max_tokens)
    overlap = body.chunking.overlap if body.chunking.overlap is not None else ingest.chunk_overlap
    overlap = min(overlap, tokens // 2)
    # Refuse unknown or out-of-range build parameters now (nothing is allocated), not at the
    # first search.
    params = check_params(body.index.kind, dict(body.index.params))

    def create() -> CollectionOut:
        with services.db.write() as session:
            quotas.guard_writes(session, principal.tenant_id, services.settings.quota)
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
                index_params=params,
                search_defaults={},
            )
            quotas.check_collections(session, principal.tenant_id, services.settings.quota)
            return CollectionOut.of(c)

    return await pools.db.run(create)


@router.get("", response_model=CollectionList)
async def list_collections(
    services: ServicesDep, principal: CurrentPrincipal, pools: PoolsDep
) -> CollectionList:
    def listing() -> CollectionList:
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

    return await pools.db.run(listing)


@router.get("/{collection_id}", response_model=CollectionOut, responses=errors(404))
async def get_collection(
    collection_id: CollectionId, services: ServicesDep, principal: CurrentPrincipal, pools: PoolsDep
) -> CollectionOut:
    def one() -> CollectionOut:
        with services.db.read() as session:
            c = collections.get(session, principal.tenant_id, collection_id)
            return CollectionOut.of(
                c,
                collections.document_counts(session, c.id),
                collections.chunk_count(session, c.id),
            )

    return await pools.db.run(one)


@router.delete("/{collection_id}", status_code=204, response_class=Response, responses=errors(404))
async def delete_collection(
    collection_id: CollectionId, services: ServicesDep, principal: CurrentPrincipal, pools: PoolsDep
) -> Response:
    def delete() -> None:
        with services.db.write() as session:
            collections.delete(session, principal.tenant_id, collection_id)

    await pools.db.run(delete)
    return Response(status_code=204)


@router.put(
    "/{collection_id}/search-defaults",
    response_model=CollectionOut,
    responses=errors(404, 413),
)
async def set_search_defaults(
    collection_id: CollectionId,
    body: SearchDefaultsIn,
    services: ServicesDep,
    principal: CurrentPrincipal,
    pools: PoolsDep,
) -> CollectionOut:
    """The knobs a search uses when the request leaves them out (`rag tune --apply` sets
    these from measurements)."""

    def store() -> CollectionOut:
        with services.db.write() as session:
            c = collections.get(session, principal.tenant_id, collection_id, lock=True)
            collections.set_search_defaults(session, c, body.model_dump(exclude_none=True))
            return CollectionOut.of(c)

    return await pools.db.run(store)


@router.post(
    "/{collection_id}/index/rebuild",
    status_code=202,
    response_model=IndexInfo,
    responses=errors(404, 413),
)
async def rebuild_index(
    collection_id: CollectionId,
    body: RebuildIn,
    services: ServicesDep,
    principal: CurrentPrincipal,
    pools: PoolsDep,
) -> IndexInfo:
    """Rebuild the collection's index from SQL, optionally into another kind, in the
    background; searches keep using the old one until the new one is swapped in."""

    def rebuild() -> IndexInfo:
        with services.db.write() as session:
            c = collections.get(session, principal.tenant_id, collection_id, lock=True)
            kind = body.kind or c.index_kind
            params = (
                body.params
                if body.params is not None
                else (c.index_params if kind == c.index_kind else {})
            )
            # Checked before anything is allocated (and inside the transaction, before the
            # row is changed).
            params = check_params(kind, dict(params))
            collections.set_index_spec(session, c, kind, params)
        services.indexes.rebuild(collection_id, None if kind == "auto" else kind, params)
        state = services.indexes.state(collection_id)
        return IndexInfo(
            kind=state.kind,
            count=state.count,
            watermark=state.watermark,
            building=state.building,
            stale=state.stale,
        )

    return await pools.db.run(rebuild)
