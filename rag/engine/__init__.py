"""ragserve's generator engine: paged KV cache, continuous batching, prefix caching, streaming.

Importing this package does not import torch; build_engine() loads the model.
"""

from rag.engine.config import EngineSettings
from rag.engine.engine import (
    Engine,
    EngineMetrics,
    GenerationBackend,
    RequestStream,
    build_engine,
)
from rag.engine.sequence import (
    EngineError,
    EngineOverloaded,
    FinishReason,
    InvalidRequest,
    SamplingParams,
    TokenEvent,
    Usage,
)

__all__ = [
    "Engine",
    "EngineError",
    "EngineMetrics",
    "EngineOverloaded",
    "EngineSettings",
    "FinishReason",
    "GenerationBackend",
    "InvalidRequest",
    "RequestStream",
    "SamplingParams",
    "TokenEvent",
    "Usage",
    "build_engine",
]
