"""Vector indexes: one small protocol, several backends, snapshots, and the manager that keeps
one live index per collection caught up with SQL."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rag.errors import Invalid
from rag.index.base import Hits, VectorIndex, read_meta
from rag.index.params import check
from rag.knobs import MAX_K, Knobs

__all__ = [
    "KINDS",
    "MAX_K",
    "Hits",
    "Knobs",
    "VectorIndex",
    "build_index",
    "check_params",
    "default_kind_for",
    "index_class",
    "load_index",
]

# Collections at or above this size get an approximate index by default.
EXACT_MAX = 10_000

KINDS = (
    "exact",
    "hnsw",
    "faiss_flat",
    "faiss_ivf",
    "faiss_ivf_sq8",
    "faiss_hnsw",
    "milvus",  # vectors in a Milvus server (RAG_MILVUS__URI), shared by every replica
)


def index_class(kind: str) -> type[VectorIndex]:
    # Imported here so that asking for one backend does not load every library.
    if kind == "exact":
        from rag.index.exact import ExactIndex

        return ExactIndex
    if kind == "hnsw":
        from rag.index.hnsw import HnswIndex

        return HnswIndex
    if kind in ("faiss_flat", "faiss_ivf", "faiss_ivf_sq8", "faiss_hnsw"):
        from rag.index import faiss as f

        classes: dict[str, type[VectorIndex]] = {
            "faiss_flat": f.FaissFlatIndex,
            "faiss_ivf": f.FaissIVFIndex,
            "faiss_ivf_sq8": f.FaissIVFSQ8Index,
            "faiss_hnsw": f.FaissHNSWIndex,
        }
        return classes[kind]
    if kind == "milvus":
        from rag.index.milvus import MilvusIndex

        return MilvusIndex
    raise Invalid(f"unknown index kind {kind!r}; choose one of {', '.join(KINDS)}")


def default_kind_for(n_vectors: int) -> str:
    """Exact flat search is both exact and fast below ~10k vectors; HNSW above."""
    return "faiss_flat" if n_vectors < EXACT_MAX else "hnsw"


def check_params(kind: str, params: dict[str, Any] | None) -> dict[str, Any]:
    """The build parameters if `kind` takes them all, within the bounds its backend declares
    (`param_schema`, see rag.index.params), else Invalid; nothing is allocated. "auto" takes
    none: the kind it becomes is chosen by size."""
    params = dict(params or {})
    if kind == "auto":
        if params:
            raise Invalid("index kind 'auto' takes no parameters: choose a kind to set them")
        return params
    return check(kind, index_class(kind).param_schema, params)


def build_index(kind: str, dim: int, params: dict[str, Any] | None = None) -> VectorIndex:
    cls = index_class(kind)
    params = check_params(kind, params)
    try:
        return cls(dim, **params)
    except TypeError as exc:
        raise Invalid(f"bad parameters for a {kind} index: {exc}") from exc


def load_index(path: Path) -> VectorIndex:
    """Load an index saved by `VectorIndex.save`, whatever its kind."""
    import json

    from rag.index.base import META_FILE

    kind = str(json.loads((path / META_FILE).read_text())["kind"])
    read_meta(path, kind)
    return index_class(kind).load(path)
