"""The embedder seam: text in, L2-normalised float32 vectors out."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

import numpy as np
import numpy.typing as npt

if TYPE_CHECKING:
    from rag.deadline import Deadline

# A token's character span in the text it came from.
Span = tuple[int, int]


class Embedder(Protocol):
    model_id: str
    dim: int
    # Content tokens the model reads before it truncates (special tokens excluded).
    max_tokens: int
    # Whether its cosines say how alike two texts are in meaning (a trained model's do; the
    # test embedder's hashes do not): the answer path compares the question with candidate
    # sentences only then.
    semantic: bool

    def embed(
        self, texts: Sequence[str], deadline: Deadline | None = None
    ) -> npt.NDArray[np.float32]:
        """Return an array [len(texts), dim] of unit vectors. A wait on another thread keeps
        to `deadline` (a search's): Unavailable when it passes first."""
        ...

    def token_spans(self, text: str) -> list[Span]:
        """The character span of every token the model would see, in order."""
        ...


def bounded(text: str, start: int, end: int, size: int) -> list[Span]:
    """[start, end) of `text` as consecutive pieces of at most `size` characters, each cut
    at the last space of its second half where there is one, else at `size`."""
    out: list[Span] = []
    while end - start > size:
        cut = text.rfind(" ", start + size // 2, start + size)
        cut = cut if cut > start else start + size
        out.append((start, cut))
        start = cut
    out.append((start, end))
    return out


def normalize(vectors: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    norms[norms == 0] = 1.0
    return (vectors / norms).astype(np.float32, copy=False)


def split_rows(
    vectors: npt.NDArray[np.float32], counts: Sequence[int]
) -> list[npt.NDArray[np.float32]]:
    """One encode call's rows handed back per caller: the first counts[0] rows, the next
    counts[1], and so on."""
    bounds = np.cumsum([0, *counts])
    return [vectors[a:b] for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
