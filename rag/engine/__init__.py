"""ragserve's generator engine: paged KV cache, continuous batching, prefix caching, streaming.

`protocol` is the contract (GenerationBackend, what callers may ask), `build` composes an
engine from settings; the local engine is sequence -> scheduler -> blocks -> runner -> model,
driven by `engine.Engine`'s step loop. Importing this package does not import torch;
build_engine() loads the model.
"""

from rag.engine.build import build_engine
from rag.engine.config import EngineAdvanced, EngineSettings
from rag.engine.engine import Engine
from rag.engine.protocol import EngineMetrics, GenerationBackend, Prompt
from rag.engine.sequence import (
    EngineError,
    EngineOverloaded,
    FinishReason,
    InvalidRequest,
    SamplingParams,
    TokenEvent,
    Usage,
)
from rag.engine.stream import RequestStream

__all__ = [
    "Engine",
    "EngineError",
    "EngineMetrics",
    "EngineOverloaded",
    "EngineAdvanced",
    "EngineSettings",
    "FinishReason",
    "GenerationBackend",
    "InvalidRequest",
    "Prompt",
    "RequestStream",
    "SamplingParams",
    "TokenEvent",
    "Usage",
    "build_engine",
]
