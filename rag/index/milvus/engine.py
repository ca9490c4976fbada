"""The connection to a Milvus server, and the shape of the collections ragserve keeps in it.

One Milvus collection per ragserve collection (per rebuild generation):

    id           INT64, primary key: the chunk id in SQL
    vector       FLOAT_VECTOR[dim], inner product (vectors are unit length: a cosine)
    document_id  VARCHAR(64): the chunk's document, for filters
    meta         JSON: the document's metadata, for filters

pymilvus is imported here only, on first use, so that a service without Milvus never loads it.
"""

from __future__ import annotations

import logging
import threading
import uuid
from typing import Any

from rag.config import MilvusSettings
from rag.errors import Invalid

log = logging.getLogger(__name__)

# Index types of Milvus's own, by the name ragserve's params use.
INDEX_TYPES = ("HNSW", "IVF_FLAT", "IVF_SQ8", "FLAT")


class MilvusEngine:
    """A MilvusClient built from settings, shared by every Milvus-backed index of a process
    (gRPC channels are safe to share between threads)."""

    def __init__(self, settings: MilvusSettings) -> None:
        if not settings.uri:
            raise Invalid(
                "index kind 'milvus' needs a Milvus server: set RAG_MILVUS__URI "
                "(for example http://milvus:19530)"
            )
        self.settings = settings
        self._client: Any = None
        self._lock = threading.Lock()

    @property
    def client(self) -> Any:
        if self._client is None:
            with self._lock:
                if self._client is None:
                    from pymilvus import MilvusClient

                    token = self.settings.token.get_secret_value() if self.settings.token else ""
                    self._client = MilvusClient(
                        uri=self.settings.uri,
                        token=token,
                        db_name=self.settings.db_name,
                        timeout=self.settings.call_timeout_s,
                    )
        return self._client

    def new_name(self, collection_id: str) -> str:
        """A fresh Milvus collection name for one build of `collection_id`."""
        return f"{self.settings.collection_prefix}_{collection_id}_{uuid.uuid4().hex[:8]}"

    def owns(self, name: str) -> bool:
        return name.startswith(self.settings.collection_prefix + "_")

    def exists(self, name: str) -> bool:
        return bool(self.client.has_collection(name, timeout=self.settings.call_timeout_s))

    def create(self, name: str, dim: int, index_type: str, build: dict[str, Any]) -> None:
        """Create (if missing) and load a collection of the shape above."""
        from pymilvus import DataType

        client = self.client
        if client.has_collection(name, timeout=self.settings.call_timeout_s):
            return
        schema = client.create_schema(auto_id=False, enable_dynamic_field=False)
        schema.add_field("id", DataType.INT64, is_primary=True)
        schema.add_field("vector", DataType.FLOAT_VECTOR, dim=dim)
        schema.add_field("document_id", DataType.VARCHAR, max_length=64)
        schema.add_field("meta", DataType.JSON)
        index_params = client.prepare_index_params()
        index_params.add_index(
            "vector", index_type=index_type, metric_type="IP", params=dict(build)
        )
        client.create_collection(
            name,
            schema=schema,
            index_params=index_params,
            consistency_level=self.settings.consistency,
            timeout=self.settings.call_timeout_s,
        )
        log.info("milvus collection %s created (%s, %d-d)", name, index_type, dim)

    def drop(self, name: str) -> None:
        client = self.client
        if client.has_collection(name, timeout=self.settings.call_timeout_s):
            client.drop_collection(name, timeout=self.settings.call_timeout_s)
            log.info("milvus collection %s dropped", name)

    def names(self) -> list[str]:
        """The Milvus collections this service's prefix owns."""
        found = self.client.list_collections(timeout=self.settings.call_timeout_s)
        return [n for n in found if self.owns(n)]

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None
