"""Per-tenant quotas and load limits (RAG_QUOTA__*; all unlimited by default).

Quotas bound what a tenant holds: live collections, live documents and their bytes, stored
conversations and the bytes of their text. A write
that would pass one is refused with `QuotaExceeded` (HTTP 403): it is checked after the rows
are written, inside the same transaction, so the refusal rolls them back and concurrent
uploads of one tenant cannot pass the quota together (its row is locked first).

Limits bound what a tenant has in flight: ingest jobs queued or running (an upload beyond is
refused with `Overloaded`, 429, until the queue drains), and answers being prepared or
generated at once in this API process (`AskSlots`, 429 beyond).
"""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator
from typing import TypeVar

from rag.config import QuotaSettings
from rag.db import Session, conversations, usage
from rag.errors import Overloaded, QuotaExceeded

MB = 1024 * 1024
T = TypeVar("T")


def guard_writes(session: Session, tenant_id: str, quota: QuotaSettings | None) -> None:
    """Call first in a transaction that a quota check ends: one such write per tenant at a
    time (nothing to do when no quota is set)."""
    if quota is not None and _any(quota):
        usage.lock_tenant(session, tenant_id)


def check_collections(session: Session, tenant_id: str, quota: QuotaSettings | None) -> None:
    """After creating a collection, in its transaction."""
    if quota is None or quota.max_collections is None:
        return
    n = usage.collections(session, tenant_id)
    if n > quota.max_collections:
        raise QuotaExceeded(
            f"this tenant may have at most {quota.max_collections} collections "
            f"(it has {n - 1}); delete one first",
            detail={"quota": "collections", "limit": quota.max_collections, "used": n - 1},
        )


def check_upload(
    session: Session, tenant_id: str, quota: QuotaSettings | None, *, new_jobs: int
) -> None:
    """After adding an upload's documents and jobs, in their transaction."""
    if quota is None or not _any(quota):
        return
    if quota.max_documents is not None or quota.max_storage_mb is not None:
        count, size = usage.documents(session, tenant_id)
        if quota.max_documents is not None and count > quota.max_documents:
            raise QuotaExceeded(
                f"this upload would make {count} documents; this tenant may have at most "
                f"{quota.max_documents}",
                detail={"quota": "documents", "limit": quota.max_documents, "used": count},
            )
        if quota.max_storage_mb is not None and size > quota.max_storage_mb * MB:
            limit = int(quota.max_storage_mb * MB)
            raise QuotaExceeded(
                f"this upload would make {size} bytes of documents; this tenant may have at "
                f"most {limit} ({quota.max_storage_mb:g} MB)",
                detail={"quota": "storage_bytes", "limit": limit, "used": size},
            )
    if quota.max_pending_jobs is not None and new_jobs:
        pending = usage.pending_jobs(session, tenant_id)
        if pending > quota.max_pending_jobs:
            raise Overloaded(
                f"this tenant has {pending - new_jobs} documents waiting to be ingested and "
                f"may queue at most {quota.max_pending_jobs}; retry when some are done",
                retry_after_s=5.0,
            )


def check_conversations(
    session: Session, tenant_id: str, quota: QuotaSettings | None, *, added_bytes: int = 0
) -> None:
    """After creating a conversation or adding a turn (of `added_bytes`), in its
    transaction."""
    if quota is None:
        return
    count, size = conversations.usage(session, tenant_id)
    if quota.max_conversations is not None and not added_bytes and count > quota.max_conversations:
        raise QuotaExceeded(
            f"this tenant may have at most {quota.max_conversations} conversations (it has "
            f"{count - 1}); delete one first",
            detail={"quota": "conversations", "limit": quota.max_conversations, "used": count - 1},
        )
    if quota.max_conversation_mb is not None and size > quota.max_conversation_mb * MB:
        limit = int(quota.max_conversation_mb * MB)
        raise QuotaExceeded(
            f"this turn would make {size} bytes of conversation text; this tenant may have at "
            f"most {limit} ({quota.max_conversation_mb:g} MB): delete a conversation first",
            detail={"quota": "conversation_bytes", "limit": limit, "used": size - added_bytes},
        )


def _any(quota: QuotaSettings) -> bool:
    return (
        quota.max_conversations is not None
        or quota.max_conversation_mb is not None
        or quota.max_documents is not None
        or quota.max_storage_mb is not None
        or quota.max_pending_jobs is not None
        or quota.max_collections is not None
    )


class AskSlots:
    """Answers in flight per tenant in this process: `take` one before the work starts (429
    beyond the limit), release it when the answer is done, however it ends."""

    def __init__(self, limit: int | None) -> None:
        self.limit = limit
        self._held: dict[str, int] = {}
        self._lock = threading.Lock()

    def take(self, tenant_id: str) -> Slot:
        with self._lock:
            held = self._held.get(tenant_id, 0)
            if self.limit is not None and held >= self.limit:
                raise Overloaded(
                    f"this tenant already has {held} answers in progress (at most "
                    f"{self.limit} at once); retry when one is done",
                    retry_after_s=1.0,
                )
            self._held[tenant_id] = held + 1
        return Slot(self, tenant_id)

    def held(self, tenant_id: str) -> int:
        with self._lock:
            return self._held.get(tenant_id, 0)

    def _release(self, tenant_id: str) -> None:
        with self._lock:
            left = self._held.get(tenant_id, 0) - 1
            if left > 0:
                self._held[tenant_id] = left
            else:
                self._held.pop(tenant_id, None)


class Slot:
    """One answer's place; releasing twice is harmless (a stream's end and its cleanup)."""

    def __init__(self, slots: AskSlots, tenant_id: str) -> None:
        self._slots, self._tenant_id = slots, tenant_id
        self._released = False
        self._lock = threading.Lock()

    def release(self) -> None:
        with self._lock:
            if self._released:
                return
            self._released = True
        self._slots._release(self._tenant_id)


async def released_after(slot: Slot, stream: AsyncIterator[T]) -> AsyncIterator[T]:
    """`stream`, with `slot` released when it ends, however it ends (a stream never started
    is released by the response's cleanup instead)."""
    try:
        async for item in stream:
            yield item
    finally:
        slot.release()
