"""Row locks that order writers."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from rag.db.models import Collection


def lock_collection(session: Session, collection_id: str) -> Collection | None:
    """Lock a collection's row (whatever its state). Every writer of its change log takes it
    first, so within a collection seq order is commit order. PostgreSQL: FOR NO KEY UPDATE,
    which serialises those writers and waits for a delete (FOR UPDATE), but not for uploads
    (FOR KEY SHARE, as their documents' foreign key takes anyway)."""
    stmt = select(Collection).where(Collection.id == collection_id).with_for_update(key_share=True)
    return session.scalar(stmt)
