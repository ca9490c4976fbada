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
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from rag.config import MilvusSettings
from rag.errors import Invalid, Overloaded

log = logging.getLogger(__name__)

# Index types of Milvus's own, by the name ragserve's params use.
INDEX_TYPES = ("HNSW", "IVF_FLAT", "IVF_SQ8", "FLAT")


class VectorEngineUnavailable(Overloaded):
    """Milvus did not answer in time (or at all): this request fails, the service does not."""

    code = "vector_engine_unavailable"


def translated(exc: BaseException, what: str) -> BaseException:
    """A timeout or an unreachable server as VectorEngineUnavailable; anything else as is."""
    if _is_timeout(exc) or _is_unavailable(exc):
        return VectorEngineUnavailable(
            f"the vector engine did not answer ({what})", retry_after_s=1.0
        )
    return exc


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
        # pymilvus logs every failed call with its traceback and the request's text (a
        # filter's metadata values among it); failures reach our callers as exceptions,
        # and they log what they need.
        logging.getLogger("pymilvus.decorators").setLevel(logging.CRITICAL)
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

    @contextmanager
    def _calling(self, what: str) -> Iterator[None]:
        try:
            yield
        except Exception as exc:
            error = translated(exc, what)
            if error is exc:
                raise
            raise error from exc

    def exists(self, name: str) -> bool:
        with self._calling("has_collection"):
            return bool(self.client.has_collection(name, timeout=self.settings.call_timeout_s))

    def create(self, name: str, dim: int, index_type: str, build: dict[str, Any]) -> None:
        """Create (if missing) and load a collection of the shape above."""
        with self._calling("create_collection"):
            client = self.client
            if not client.has_collection(name, timeout=self.settings.call_timeout_s):
                self._create(client, name, dim, index_type, build)

    def _create(
        self, client: Any, name: str, dim: int, index_type: str, build: dict[str, Any]
    ) -> None:
        from pymilvus import DataType

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
        with self._calling("drop_collection"):
            client = self.client
            if client.has_collection(name, timeout=self.settings.call_timeout_s):
                client.drop_collection(name, timeout=self.settings.call_timeout_s)
                log.info("milvus collection %s dropped", name)

    def names(self) -> list[str]:
        """The Milvus collections this service's prefix owns."""
        with self._calling("list_collections"):
            found = self.client.list_collections(timeout=self.settings.call_timeout_s)
        return [n for n in found if self.owns(n)]

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None


def _grpc_code(exc: BaseException) -> str | None:
    code = getattr(exc, "code", None)
    if callable(code):
        try:
            return str(getattr(code(), "name", code()))
        except Exception:
            return None
    return None


def _is_timeout(exc: BaseException) -> bool:
    if _grpc_code(exc) == "DEADLINE_EXCEEDED":
        return True
    return type(exc).__name__ == "MilvusException" and "timeout" in str(exc).lower()


def _is_unavailable(exc: BaseException) -> bool:
    if _grpc_code(exc) == "UNAVAILABLE":
        return True
    if type(exc).__name__ == "MilvusUnavailableException":
        return True
    # pymilvus's "Fail connecting to server" (no server at the URI, or it went away).
    return type(exc).__name__ == "MilvusException" and getattr(exc, "code", None) == 2
