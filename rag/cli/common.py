"""What every `rag` command shares: settings loaded once (invalid ones exit readably), the
service's data found from any folder, services built for an operator's command, and progress
bars on stderr."""

from __future__ import annotations

import json
import logging
import os
import sys
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from rag.config import Settings

if TYPE_CHECKING:
    from rag.services import Services

log = logging.getLogger("rag.cli")
T = TypeVar("T")


def load_settings() -> Settings:
    try:
        return Settings()
    except Exception as exc:  # unknown or invalid options fail at startup, readably
        sys.exit(f"invalid configuration: {exc}")


# ---------------------------------------------------------------- where the service's data is


def serve_record() -> Path:
    """Where `rag serve` notes its data directory and database, so that `rag ingest`, `ask`
    and `eval` run from another folder find them."""
    return Path.home() / ".local" / "state" / "ragserve" / "serve.json"


def record_serve(settings: Settings, url: str) -> None:
    """Written by `rag serve` at start (readable by its owner only: the database URL may
    carry a password)."""
    path = serve_record()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        record = {
            "data_dir": str(settings.data_dir.resolve()),
            "database_url": settings.database_url,
            "url": url,
        }
        tmp = path.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(record, f)
        os.replace(tmp, path)
    except OSError as exc:  # a read-only home must not stop the server
        log.warning("could not record the server's data location in %s: %s", path, exc)


def data_settings() -> Settings:
    """Settings for a command that reads the service's data (ingest, ask, eval).

    Configured (RAG_DATA_DIR or RAG_DATABASE__URL): that. Otherwise `./data` when it holds a
    database, else the data of the last `rag serve` on this machine (said on stderr). Never
    creates an empty database somewhere unexpected: with none of these, it exits and says
    where it looked."""
    settings = load_settings()
    if {"data_dir", "database"} & settings.model_fields_set:
        return settings
    if _sqlite_file(settings.database_url).exists():
        return settings
    try:
        record = json.loads(serve_record().read_text())
        found = settings.model_copy(
            update={
                "data_dir": Path(record["data_dir"]),
                "database": settings.database.model_copy(update={"url": record["database_url"]}),
            }
        )
    except (OSError, ValueError, KeyError, TypeError):
        found = None
    if found is not None and (
        not found.database_url.startswith("sqlite") or _sqlite_file(found.database_url).exists()
    ):
        print(f"using the data of the server last started at {found.data_dir}", file=sys.stderr)
        return found
    sys.exit(
        f"no ragserve database in {settings.data_dir.resolve()} (and no `rag serve` recorded in "
        f"{serve_record()}): run this where the service keeps its data, set RAG_DATA_DIR or "
        "RAG_DATABASE__URL, or pass --url and --key to use a running server"
    )


def _sqlite_file(url: str) -> Path:
    prefix = "sqlite:///"
    return Path(url[len(prefix) :]) if url.startswith(prefix) else Path("/nonexistent")


# ---------------------------------------------------------------- services


def offline_services(settings: Settings, *, worker: bool = False) -> Services:
    """Services for an operator's command: no admin-key banner, a worker only if asked."""
    from rag.services import build_services

    return build_services(settings, in_process_worker=worker, announce_admin_key=False)


# ---------------------------------------------------------------- progress on stderr


def progress(desc: str, unit: str = "it") -> Callable[[Iterable[T]], Iterable[T]]:
    def wrap(items: Iterable[T]) -> Iterable[T]:
        from tqdm import tqdm

        return tqdm(list(items), desc=desc, unit=unit, file=sys.stderr)

    return wrap


def with_bar(desc: str, total: int, work: Callable[[], T], done: Callable[[T], int]) -> T:
    """Run `work` under a bar that ticks while it runs and fills to `done(result)` when it
    is done (for work that reports no progress of its own, such as an index rebuild)."""
    from tqdm import tqdm

    with (
        ThreadPoolExecutor(1, thread_name_prefix="cli-work") as pool,
        tqdm(total=total, desc=desc, file=sys.stderr) as bar,
    ):
        future = pool.submit(work)
        while True:
            try:
                result = future.result(timeout=0.2)
                break
            except FutureTimeout:
                bar.refresh()
        count = done(result)
        bar.total = max(total, count)
        bar.update(count)
    return result
