"""An upload, from bytes to a durable ingest job: the type is detected from the content, then
one SQL transaction stores the blob, the document row and its job."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rag import quota as quotas
from rag.config import QuotaSettings
from rag.db import Database, collections, documents
from rag.db.documents import Accepted
from rag.upload.detect import detect_media_type


@dataclass
class Incoming:
    filename: str
    data: bytes
    declared: str | None  # the media type the client claimed, if any
    meta: dict[str, Any]


def accept(
    db: Database, tenant_id: str, collection_id: str, incoming: Sequence[Incoming], *,
    max_attempts: int, quota: QuotaSettings | None = None,
) -> list[Accepted]:  # fmt: skip
    """Every item's type is checked before anything is written: a bad file refuses the whole
    batch (UnsupportedMediaType, Invalid). Then one transaction: committed means durable. An
    upload that would pass the tenant's quota (QuotaExceeded) or pending-jobs limit
    (Overloaded) is refused whole, its rows rolled back."""
    typed = [
        (item, detect_media_type(item.data, item.filename, item.declared)) for item in incoming
    ]
    accepted = []
    with db.write() as session:
        quotas.guard_writes(session, tenant_id, quota)
        # Locked (SQLite: the write lock held since BEGIN IMMEDIATE): a delete racing this
        # upload either tombstones its document or is seen here, never neither.
        collection = collections.get(session, tenant_id, collection_id, share=True)
        for item, media_type in typed:
            accepted.append(
                documents.add(
                    session,
                    collection,
                    filename=item.filename,
                    media_type=media_type,
                    data=item.data,
                    sha256=hashlib.sha256(item.data).hexdigest(),
                    meta=item.meta,
                    max_attempts=max_attempts,
                )
            )
        new_jobs = sum(1 for a in accepted if not a.duplicate or a.requeued)
        quotas.check_upload(session, tenant_id, quota, new_jobs=new_jobs)
    return accepted
