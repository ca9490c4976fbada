"""A collection's live index and what callers may know of it."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from rag.index.base import Hits, VectorIndex

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class IndexState:
    collection_id: str
    kind: str
    count: int
    watermark: int  # the last change-log seq applied
    generation: int | None  # the snapshot generation it started from, if any
    building: bool  # a rebuild is running in the background
    stale: bool  # the last catch-up did not finish: results may miss recent changes
    # Seconds since a catch-up last finished (None: never in this process).
    caught_up_s_ago: float | None = None


@dataclass(frozen=True)
class SearchOutcome:
    hits: list[Hits]
    state: IndexState


@dataclass
class Live:
    """One collection's index in this process, with where it stands against the change log."""

    collection_id: str
    index: VectorIndex
    watermark: int
    auto: bool  # kind follows the collection's size
    generation: int | None = None
    # The change-log seq up to which removed chunks were erased from the index (not just
    # tombstoned): snapshots are written only once it has reached the watermark.
    erased_to: int = 0
    changes_since_snapshot: int = 0
    building: bool = False
    stale: bool = False
    spec_checked_at: float = 0.0
    caught_up_at: float | None = None  # time.monotonic() when a catch-up last finished
    # Ids the last check against SQL found missing or extra (None: not checked yet).
    mismatch: int | None = None

    def __post_init__(self) -> None:
        # Held while changes are applied, snapshots written and rebuilds swapped in.
        self.lock = threading.Lock()

    def state(self) -> IndexState:
        index = self.index
        return IndexState(
            collection_id=self.collection_id,
            kind=index.kind,
            count=len(index),
            watermark=self.watermark,
            generation=self.generation,
            building=self.building,
            stale=self.stale,
            caught_up_s_ago=(
                None if self.caught_up_at is None else time.monotonic() - self.caught_up_at
            ),
        )

    def catch_up(self, apply: Callable[[Live, float | None], int], wait_s: float | None) -> int:
        """Run `apply` (a keeper's catch-up) under the lock; returns the rows it applied.

        With `wait_s`, gives up (and marks the index stale) if another thread is applying
        changes for longer than that, and a failure is logged rather than raised: the caller
        then searches what is there."""
        if not self.lock.acquire(timeout=-1 if wait_s is None else wait_s):
            self.stale = True
            return 0
        try:
            count = apply(self, wait_s)
        except Exception:
            self.stale = True
            log.exception("index catch-up failed for collection %s", self.collection_id)
            if wait_s is None:
                raise
            return 0
        else:
            self.stale = False
            self.caught_up_at = time.monotonic()
            return count
        finally:
            self.lock.release()
