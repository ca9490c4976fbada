"""The system of record: tables, sessions, migrations and the queries the services share."""

from rag.db.session import Database

__all__ = ["Database"]
