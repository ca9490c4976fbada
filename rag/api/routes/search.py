from __future__ import annotations

from typing import Annotated

from fastapi import Path, Response

from rag.answer import history as histories
from rag.api.body import Router
from rag.api.deps import CurrentPrincipal, PoolsDep, ServicesDep
from rag.api.mapping import retrieval
from rag.api.openapi import WITH_BODY, errors
from rag.api.schemas_search import IndexInfo, SearchIn, SearchOut, passages_out
from rag.ops.metrics import observe_stages
from rag.services import Services

router = Router(tags=["search"], responses=WITH_BODY)


@router.post(
    "/v1/collections/{collection_id}/search", response_model=SearchOut, responses=errors(404)
)
async def search(
    collection_id: Annotated[str, Path(max_length=64)],
    body: SearchIn,
    services: ServicesDep,
    principal: CurrentPrincipal,
    pools: PoolsDep,
) -> Response:
    """The top-k passages for a query, with the knobs actually used, per-stage timings, and
    whether anything was degraded to stay within the latency budget. With `history`, a
    follow-up query is made stand-alone first (`searched_query`). Runs on the search
    threads: 429 with Retry-After when they are all busy and enough searches wait."""
    return await pools.search.run(
        _search, services, principal.tenant_id, collection_id, body, principal.is_admin
    )


def _search(
    services: Services, tenant_id: str, collection_id: str, body: SearchIn, admin: bool
) -> Response:
    knobs, filt = retrieval(body, budget_ms=body.budget_ms)
    query = body.query
    if body.history:
        turns = [histories.Turn(t.question, t.answer) for t in body.history]
        ask = services.settings.ask
        histories.check_bounds(turns, ask.max_history_turns, ask.max_history_chars)
        rewrite = ask.rewrite if body.rewrite is None else body.rewrite
        query = histories.resolve(query, turns, rewrite=rewrite).query
    result = services.retriever.search(tenant_id, collection_id, query, knobs, filt)
    observe_stages("search", result.timings_ms)
    state = result.index
    out = SearchOut(
        passages=passages_out(result.passages),
        knobs=result.knobs_used(),
        timings_ms=result.timings_ms,
        degraded=bool(result.degraded),
        degradations=result.degraded,
        over_budget=result.over_budget,
        partial=result.partial,
        index=IndexInfo.of(state, admin=admin),
        searched_query=query,
    )
    # Serialised here, once: FastAPI would validate the model again against response_model
    # and encode it in two more passes, for the same bytes (docs/decisions.md, 2026-11-30).
    return Response(out.model_dump_json(), media_type="application/json")
