"""Logging set-up: plain or JSON lines, each with the request id of the request it belongs to.

Log ids, never document text, prompts or keys. The request id lives in a contextvar that the
API middleware sets per request (rag.api.middleware); `RequestIdFilter` copies it onto every
record, so plain and JSON lines both carry it without any call site passing it.
"""

from __future__ import annotations

import json
import logging
import os
import random
import sys
from contextvars import ContextVar

# "-" outside a request (workers, startup), so the field is always present.
request_id: ContextVar[str] = ContextVar("request_id", default="-")

# Ids of requests are made on the event loop, one or more a request. uuid4 reads the
# system's random source, a system call that lets go of the GIL: the loop then waits its
# turn to take it back from whichever thread is busy, once a request, and a burst of
# requests held every tenant's behind those turns. An id only has to be unique, not secret.
_ids = random.Random(os.urandom(32))
# A forked child would otherwise make the same ids as its parent.
os.register_at_fork(after_in_child=lambda: _ids.seed(os.urandom(32)))


def new_id() -> str:
    """32 hex characters (as uuid4().hex), made without a system call."""
    return f"{_ids.getrandbits(128):032x}"


PLAIN_FORMAT = "%(asctime)s %(levelname)s %(name)s [%(request_id)s] %(message)s"


class RequestIdFilter(logging.Filter):
    """Stamps the current request id on each record (a filter, so it runs in the thread and
    context that logged, not later at format time)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not hasattr(record, "request_id"):
            record.request_id = request_id.get()
        return True


class QuietLibraries(logging.Filter):
    """Drops the INFO chatter of ONNX Runtime's graph optimiser (about twenty lines at every
    start, one per fusion) while keeping its warnings."""

    NOISY = ("onnxruntime/transformers",)

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.WARNING:
            return True
        path = record.pathname.replace("\\", "/")
        return not any(part in path for part in self.NOISY)


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out = {
            "ts": round(record.created, 3),
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
            "request_id": getattr(record, "request_id", None) or request_id.get(),
        }
        for key in ("job_id", "collection_id"):
            if hasattr(record, key):
                out[key] = getattr(record, key)
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out)


def setup(level: str = "INFO", json_lines: bool = False) -> None:
    """Call once at startup with `settings.log_level` and `settings.log_json`."""
    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(RequestIdFilter())
    handler.addFilter(QuietLibraries())
    if json_lines:
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter(PLAIN_FORMAT))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # sqlalchemy.engine would log statements with their parameters (document text, key
    # hashes) at INFO: keep it at WARNING whatever the level.
    for noisy in ("httpx", "sentence_transformers", "transformers", "alembic", "sqlalchemy"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
