"""Vectors in Milvus (Standalone, Distributed, or `milvus-lite server`): one Milvus collection
per ragserve collection, derived from SQL like every other index, shared by every replica."""

from rag.index.milvus.engine import MilvusEngine, VectorEngineUnavailable
from rag.index.milvus.index import MilvusIndex

__all__ = ["MilvusEngine", "MilvusIndex", "VectorEngineUnavailable"]
