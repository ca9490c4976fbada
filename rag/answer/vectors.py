"""The evidence step's vectors, kept: a passage's units are embedded once per tenant.

The evidence step (rag.answer.evidence) compares the question with its best units in the
embedding model's space, in two batches of the query encoder: the units with their title and
heading, then with the subject taken out. Those texts depend on the passage (and, the second
time, on the question's names), not on the wording of the question: a passage given again
gives the same texts, and their vectors are the same. `UnitVectors` keeps them, so a question
over passages seen before embeds little more than itself.

- Per tenant: the key is a hash of the tenant and the text, so one tenant's question never
  finds (nor times) a vector another tenant's passage left. No text is kept.
- Bounded: the least recently used vectors leave first.
- Erased with deletes: the purge tells the cache when chunks leave the record
  (`Purger.subscribe`), and the cache empties, so nothing derived from a deleted document
  outlives the purge.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from collections.abc import Callable

import numpy as np
import numpy.typing as npt

Embed = Callable[[list[str]], npt.NDArray[np.float32]]

CAPACITY = 8192  # vectors (384 float32 each: about 12 MiB)


class UnitVectors:
    def __init__(self, capacity: int = CAPACITY) -> None:
        self.capacity = capacity
        self._kept: OrderedDict[bytes, npt.NDArray[np.float32]] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._kept)

    def clear(self) -> None:
        with self._lock:
            self._kept.clear()

    def embed(self, tenant_id: str, embed: Embed) -> Embed:
        """`embed` with the vectors of texts this tenant embedded before taken from the cache:
        one call of `embed` for the rest, in their order, none when there is none."""

        def kept(texts: list[str]) -> npt.NDArray[np.float32]:
            if not texts:
                return embed(texts)
            keys = [_key(tenant_id, t) for t in texts]
            found: dict[int, npt.NDArray[np.float32]] = {}
            with self._lock:
                for n, k in enumerate(keys):
                    v = self._kept.get(k)
                    if v is not None:
                        self._kept.move_to_end(k)
                        found[n] = v
            missing = [n for n in range(len(texts)) if n not in found]
            if missing:
                fresh = embed([texts[n] for n in missing])
                with self._lock:
                    for n, v in zip(missing, fresh, strict=True):
                        found[n] = v
                        self._kept[keys[n]] = v
                        self._kept.move_to_end(keys[n])
                    while len(self._kept) > self.capacity:
                        self._kept.popitem(last=False)
            return np.stack([found[n] for n in range(len(texts))])

        return kept


def _key(tenant_id: str, text: str) -> bytes:
    h = hashlib.blake2b(digest_size=16)
    h.update(tenant_id.encode())
    h.update(b"\0")
    h.update(text.encode("utf-8", "surrogatepass"))
    return h.digest()
