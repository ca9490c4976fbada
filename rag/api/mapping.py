"""Request bodies to the domain's values: the retrieval knobs and the filter that a search and
an ask both carry, mapped in one place so the two routes cannot come to read them apart."""

from __future__ import annotations

from rag.api.schemas_ask import AskIn
from rag.api.schemas_search import SearchFilter, SearchIn
from rag.knobs import Knobs
from rag.retrieve import Filter


def retrieval(
    body: SearchIn | AskIn, budget_ms: float | None = None
) -> tuple[Knobs, Filter | None]:
    """The body's knobs and filter as the retriever takes them. `budget_ms` is the search's
    own budget: an ask's budget is the whole request's, and not a knob."""
    knobs = Knobs(
        k=body.k,
        ef_search=body.ef_search,
        nprobe=body.nprobe,
        exact=body.exact,
        hybrid=body.hybrid,
        budget_ms=budget_ms,
    )
    return knobs, _filter(body.filter)


def _filter(f: SearchFilter | None) -> Filter | None:
    if f is None:
        return None
    ids = tuple(f.document_ids) if f.document_ids is not None else None
    return Filter(document_ids=ids, metadata=f.metadata)
