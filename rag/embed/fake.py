"""A deterministic, model-free embedder for tests that are about something else."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from rag.deadline import Deadline
from rag.embed.base import Span, normalize

_WORD = re.compile(r"\w+|[^\w\s]", re.UNICODE)


class HashEmbedder:
    """Bag of hashed words: deterministic, instant, and similar texts get similar vectors."""

    semantic = False  # hashes of words: no meaning in their cosines

    def __init__(self, dim: int = 384, max_tokens: int = 254) -> None:
        self.dim = dim
        self.max_tokens = max_tokens
        self.model_id = f"hash-{dim}"
        self.calls: list[int] = []  # batch sizes asked for, for tests that check batching

    def embed(
        self, texts: Sequence[str], deadline: Deadline | None = None
    ) -> npt.NDArray[np.float32]:
        self.calls.append(len(texts))
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for row, text in enumerate(texts):
            for match in _WORD.finditer(text.lower()):
                digest = hashlib.blake2b(match.group().encode(), digest_size=8).digest()
                h = int.from_bytes(digest, "little")
                out[row, h % self.dim] += 1.0 if (h >> 32) & 1 else -1.0
        return normalize(out)

    def token_spans(self, text: str) -> list[Span]:
        return [m.span() for m in _WORD.finditer(text)]
