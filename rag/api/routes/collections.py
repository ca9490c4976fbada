from __future__ import annotations

from typing import Annotated, Any

from fastapi import BackgroundTasks, Path, Query, Response

from rag import quota as quotas
from rag.answer import warm
from rag.api.body import Router
from rag.api.deps import CurrentPrincipal, PoolsDep, ServicesDep
from rag.api.openapi import AUTHENTICATED, available_kinds, errors
from rag.api.schemas import CollectionCreate, CollectionList, CollectionOut
from rag.api.schemas_search import IndexInfo, RebuildIn, SearchDefaultsIn, WarmOut
from rag.db import collections
from rag.errors import Invalid
from rag.index import check_params
from rag.services import Services

router = Router(prefix="/v1/collections", tags=["collections"], responses=AUTHENTICATED)

CollectionId = Annotated[str, Path(max_length=64)]


def index_spec(services: Services, kind: str, params: dict[str, Any]) -> dict[str, Any]:
    """The parameters, checked for the kind (nothing allocated); a kind this deployment
    cannot build (milvus without RAG_MILVUS__URI) is refused too."""
    if kind != "auto" and kind not in available_kinds(services.settings):
        raise Invalid(f"index kind {kind!r} is not available here (it needs RAG_MILVUS__URI)")
    return check_params(kind, params)


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
    params = index_spec(services, body.index.kind, dict(body.index.params))

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

    max_k = services.settings.search.max_k
    if body.k is not None and body.k > max_k:  # what /openapi.json states for this service
        raise Invalid(f"k must be between 1 and {max_k}, got {body.k}")

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
            params = index_spec(services, kind, dict(params))
            collections.set_index_spec(session, c, kind, params)
        services.indexes.rebuild(collection_id, None if kind == "auto" else kind, params)
        return IndexInfo.of(services.indexes.state(collection_id), admin=principal.is_admin)

    return await pools.db.run(rebuild)


@router.post(
    "/{collection_id}/warm", status_code=202, response_model=WarmOut, responses=errors(404, 409)
)
async def warm_passages(
    collection_id: CollectionId,
    services: ServicesDep,
    principal: CurrentPrincipal,
    pools: PoolsDep,
    background: BackgroundTasks,
    limit: Annotated[int, Query(ge=1, le=100_000)] = 1000,
) -> WarmOut:
    """Compute the KV of the collection's passages (its first `limit` chunks) into the
    generator's passage cache in the background, one prompt at a time, until the cache is
    full: the first questions over them then reuse it. 409 when the generator keeps none."""
    items = await pools.db.run(warm.passages, services, principal.tenant_id, collection_id, limit)
    background.add_task(warm.warm, services, principal.tenant_id, items)
    return WarmOut(passages=len(items))
