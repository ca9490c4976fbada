"""Embedders: text in, L2-normalised float32 vectors out.

`SentenceTransformerEmbedder` wraps the bundled all-MiniLM-L6-v2 (or any sentence-transformers
folder) and embeds search queries on its query lane with ONNX Runtime, in int8 unless
`query_format` says otherwise; `HashEmbedder` is a deterministic, model-free embedder for tests
that are about something other than embedding quality.
"""

from __future__ import annotations

from rag.config import EmbedSettings
from rag.embed.base import Embedder, Span, normalize, split_rows
from rag.embed.fake import HashEmbedder
from rag.embed.lane import QueryLane
from rag.embed.onnx import OnnxQueryEncoder
from rag.embed.sentence import SentenceTransformerEmbedder

__all__ = [
    "Embedder",
    "HashEmbedder",
    "OnnxQueryEncoder",
    "QueryLane",
    "SentenceTransformerEmbedder",
    "Span",
    "build_embedder",
    "normalize",
    "split_rows",
]


def build_embedder(settings: EmbedSettings) -> Embedder:
    if settings.backend == "hash":
        return HashEmbedder(settings.advanced.hash_dim)
    return SentenceTransformerEmbedder(
        settings.model_path,
        device=settings.device,
        batch_size=settings.batch_size,
        query_threads=settings.advanced.query_threads,
        query_backend=settings.advanced.query_backend,
        query_format=settings.advanced.query_format,
        query_priority=settings.advanced.query_priority,
        ingest_yield_ms=settings.advanced.ingest_yield_ms,
    )
