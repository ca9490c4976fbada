"""The system of record: tables, sessions, migrations, and every query the services run.

One query module per table family (collections, documents, chunks, keys, jobs, change log,
full text), the purge's and the quotas' (purge, usage), and one vector codec; nothing outside
this package builds SQL.
"""

from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from rag.db.session import Database, transient

# Session: the type of what Database.read() / .write() yield, for callers' signatures.
__all__ = ["Database", "IntegrityError", "Session", "transient"]
