"""The composition root: build every service once from Settings, start and stop them."""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from rag import heap
from rag.answer.vectors import UnitVectors
from rag.auth import KeyCache, ensure_admin_key, save_admin_key
from rag.config import Settings
from rag.db import Database
from rag.db.migrate import upgrade
from rag.embed import Embedder, build_embedder
from rag.index.manager import IndexManager
from rag.purge import Purger, Removed
from rag.quality import Quality
from rag.quota import AskSlots
from rag.retrieve import Retriever

if TYPE_CHECKING:
    from ingest.worker import Worker
    from rag.engine.protocol import GenerationBackend

log = logging.getLogger(__name__)


@dataclass
class Services:
    settings: Settings
    db: Database
    embedder: Embedder
    indexes: IndexManager
    retriever: Retriever
    key_cache: KeyCache
    # Erases what deletes left behind (rag.purge); `purger.subscribe` tells a cache of
    # derived data (the engine's KV caches) which chunks left the record.
    purger: Purger
    # The evidence step's unit vectors, per tenant (rag.answer.vectors); emptied by the purge.
    unit_vectors: UnitVectors = field(default_factory=UnitVectors)
    # Answers in flight per tenant (RAG_QUOTA__MAX_CONCURRENT_ASKS): the routes that answer
    # take a slot first.
    asks: AskSlots = field(default_factory=lambda: AskSlots(None))
    # Answer records, feedback, drift (rag.quality): built with the rest, off when
    # quality.enabled is false.
    quality: Quality | None = None
    workers: list[Worker] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)
    # The generator is built on first use (ingest-only processes never load it), or passed
    # in by tests.
    _engine: GenerationBackend | None = None
    _engine_lock: threading.Lock = field(default_factory=threading.Lock)
    _engine_loader: threading.Thread | None = None
    # Set by a serving process's app (rag.heap): the loaded generator's objects are frozen too.
    freeze_heap: bool = False
    # Built here (and so closed here), not passed in by a caller that shares it.
    _own_embedder: bool = False

    @property
    def engine(self) -> GenerationBackend:
        if self._engine is None:
            with self._engine_lock:
                if self._engine is None:
                    from rag.engine.build import build_engine

                    self._engine = self._adopt(build_engine(self.settings.engine))
        return self._engine

    def _adopt(self, engine: GenerationBackend) -> GenerationBackend:
        # Deleted chunks leave the engine's KV caches, in every process.
        self.purger.subscribe(lambda removed: _drop_chunks(engine, removed))
        return engine

    @property
    def engine_loaded(self) -> bool:
        return self._engine is not None

    @property
    def engine_loading(self) -> bool:
        return self._engine is None and self._engine_loader is not None

    def load_engine(self) -> None:
        """Build the generator now in a background thread, so the first question does not
        wait for the model to load (a request that comes first waits for the same build)."""
        if self._engine is not None or self._engine_loader is not None:
            return

        def load() -> None:
            try:
                _ = self.engine
                if self.freeze_heap:  # the model's objects join the start-up ones
                    heap.freeze(collect=False)
            except Exception:
                log.exception("the generator could not be loaded; the first ask will retry")
            finally:
                self._engine_loader = None

        self._engine_loader = threading.Thread(target=load, name="engine-load", daemon=True)
        self._engine_loader.start()

    def start(self) -> None:
        self.indexes.start(self.settings.index.catch_up_interval_s)
        self.start_purger()
        if self.quality is not None:
            self.quality.start()
        for worker in self.workers:
            self._threads.append(worker.start_thread(self.stop))

    def start_purger(self) -> None:
        if self.settings.purge.enabled:
            self.purger.start()

    def wake_workers(self) -> None:
        for worker in self.workers:
            worker.wake.set()

    def close(self) -> None:
        self.stop.set()
        self.wake_workers()
        for thread in self._threads:
            thread.join(timeout=30)
        self._threads.clear()
        self.purger.close()
        if self.quality is not None:
            self.quality.close()  # what is queued is written before the database goes
        loader = self._engine_loader
        if loader is not None:
            loader.join()  # a model half loaded is not left to a dying process
        if self._engine is not None:
            self._engine.close()
        self.indexes.close()
        if self._own_embedder:
            close = getattr(self.embedder, "close", None)
            if close is not None:
                close()
        self.db.dispose()


def build_services(
    settings: Settings,
    *,
    embedder: Embedder | None = None,
    engine: GenerationBackend | None = None,
    in_process_worker: bool | None = None,
    announce_admin_key: bool = True,
) -> Services:
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    db = Database(settings.database_url, echo=settings.database.echo)
    upgrade(db)
    configured = settings.auth.admin_key.get_secret_value() if settings.auth.admin_key else None
    generated = ensure_admin_key(db, configured)
    if generated:
        # To a file only its owner can read, never to stdout (a container's log) or a log.
        where = save_admin_key(settings.data_dir, generated)
        if announce_admin_key:
            print(
                f"\nGenerated an admin API key: it is in {where} (readable by this user only)."
                "\nStore it somewhere safe, then delete the file; or set RAG_AUTH__ADMIN_KEY.\n",
                flush=True,
            )
    own_embedder = embedder is None
    embedder = embedder or build_embedder(settings.embed)
    indexes = IndexManager(
        db,
        settings.data_dir,
        embedder.model_id,
        embedder.dim,
        snapshot_every=settings.index.snapshot_every,
        keep_generations=settings.index.keep_generations,
        milvus=settings.milvus,
        erase_interval_s=(settings.purge.interval_s if settings.purge.enabled else float("inf")),
    )
    retriever = Retriever(db, embedder, indexes, settings.search)
    services = Services(
        settings=settings,
        db=db,
        embedder=embedder,
        indexes=indexes,
        retriever=retriever,
        key_cache=KeyCache(settings.auth.key_cache_s),
        purger=Purger(
            db,
            settings.purge,
            _retention_s(settings),
            answers_retention_s=settings.quality.retention_days * 86400,
        ),  # fmt: skip
        asks=AskSlots(settings.quota.max_concurrent_asks),
        quality=Quality(db, settings.quality),
        _own_embedder=own_embedder,
    )
    # Deleted chunks' unit vectors leave with them.
    services.purger.subscribe(lambda _removed: services.unit_vectors.clear())
    if engine is not None:
        services._engine = services._adopt(engine)
    run_worker = (
        settings.ingest.in_process_worker if in_process_worker is None else (in_process_worker)
    )
    if run_worker:
        services.workers.append(make_worker(services))
    return services


def _retention_s(settings: Settings) -> float | None:
    days = settings.conversations.retention_days
    return None if days is None else days * 86400.0


def make_worker(services: Services) -> Worker:
    from ingest.pipeline import Pipeline
    from ingest.worker import Worker

    pipeline = Pipeline(services.db, services.embedder, services.settings.ingest)
    return Worker(services.db, pipeline, services.settings.ingest)


def _drop_chunks(engine: GenerationBackend, removed: list[Removed]) -> None:
    engine.drop_chunks({cid for r in removed for cid in r.chunk_ids})
