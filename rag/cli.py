"""The `rag` command: serve, worker, migrate, keys, and the engine's commands."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from rag.config import Settings

if TYPE_CHECKING:
    from rag.index.manager import IndexState

log = logging.getLogger("rag.cli")


def _settings() -> Settings:
    try:
        return Settings()
    except Exception as exc:  # unknown or invalid options fail at startup, readably
        sys.exit(f"invalid configuration: {exc}")


def cmd_serve(args: argparse.Namespace) -> int:
    import uvicorn

    from rag import logs
    from rag.api.app import create_app

    settings = _settings()
    if args.no_worker:
        settings.ingest.in_process_worker = False
    logs.setup(settings.log_level, settings.log_json)
    app = create_app(settings)
    uvicorn.run(
        app,
        host=args.host or settings.api.host,
        port=args.port or settings.api.port,
        log_level=settings.log_level.lower(),
        access_log=False,
    )
    return 0


def cmd_worker(args: argparse.Namespace) -> int:
    from rag import logs
    from rag.services import build_services, make_worker

    settings = _settings()
    logs.setup(settings.log_level, settings.log_json)
    # A worker embeds documents, never search queries: no ONNX export for queries at start.
    settings.embed.query_backend = "torch"
    services = build_services(settings, in_process_worker=False, announce_admin_key=False)
    workers = [make_worker(services) for _ in range(args.concurrency)]
    stop = threading.Event()

    def _stop(*_: object) -> None:
        stop.set()
        for w in workers:
            w.wake.set()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    threads = [w.start_thread(stop) for w in workers]
    while any(t.is_alive() for t in threads):
        for t in threads:
            t.join(timeout=0.5)
    services.close()
    return 0


def cmd_migrate(args: argparse.Namespace) -> int:
    from rag.db import Database
    from rag.db.migrate import downgrade, upgrade

    settings = _settings()
    db = Database(settings.database_url)
    if args.downgrade:
        downgrade(db, args.downgrade)
    else:
        upgrade(db, args.revision)
    print("ok")
    return 0


def cmd_keys_create(args: argparse.Namespace) -> int:
    from rag.auth import create_key
    from rag.db import Database
    from rag.db.migrate import upgrade

    settings = _settings()
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    db = Database(settings.database_url)
    upgrade(db)
    key, tenant_id = create_key(db, args.tenant, is_admin=args.admin)
    print(f"tenant: {args.tenant} ({tenant_id})")
    print(f"key:    {key}")
    print("The key is shown once; only its hash is stored.")
    return 0


def _offline_services(settings: Settings):  # type: ignore[no-untyped-def]
    """Services for an operator command: no worker, no admin-key banner."""
    from rag.services import build_services

    return build_services(settings, in_process_worker=False, announce_admin_key=False)


def cmd_index_rebuild(args: argparse.Namespace) -> int:
    import json

    from rag.db import repo
    from rag.db.models import Collection
    from rag.index import build_index

    settings = _settings()
    services = _offline_services(settings)
    try:
        params = json.loads(args.params) if args.params else None
        with services.db.write() as session:
            row = session.get(Collection, args.collection)
            if row is None or row.deleted_at is not None:
                sys.exit(f"no collection {args.collection}")
            kind = args.kind or row.index_kind
            if params is None:
                params = row.index_params if kind == row.index_kind else {}
            if kind != "auto":
                build_index(kind, services.embedder.dim, params)
            row.index_kind, row.index_params = kind, params
            expected = repo.chunk_count(session, args.collection)
        t0 = time.perf_counter()
        state = _with_bar(
            "rebuild",
            expected,
            # Opening the index (snapshot or SQL) is part of the wait, so it runs under the bar.
            lambda: services.indexes.rebuild(
                args.collection, None if kind == "auto" else kind, params
            ).result(),
        )
        took = time.perf_counter() - t0
        print(
            f"rebuilt {args.collection}: {state.kind}, {state.count} vectors, "
            f"watermark {state.watermark}, generation {state.generation} ({took:.1f} s)"
        )
    finally:
        services.close()
    return 0


def cmd_tune(args: argparse.Namespace) -> int:
    from pathlib import Path

    from rag import tune

    settings = _settings()
    services = _offline_services(settings)
    try:
        queries = tune.read_queries(Path(args.queries)) if args.queries else None
        report = tune.tune(
            services,
            args.collection,
            queries=queries,
            n_queries=args.n,
            k=args.k,
            target_recall=args.target_recall,
            budget_ms=args.budget_ms,
            apply=args.apply,
            progress=_progress("tune"),
        )
        print(report.table())
        png = Path(args.png or settings.data_dir / "tune" / f"{args.collection}.png")
        print(f"curve: {tune.draw(report, png)}")
        if report.chosen is None:
            print(
                f"no setting reaches recall {args.target_recall}"
                + (f" within {args.budget_ms} ms" if args.budget_ms else "")
            )
            return 1
        c = report.chosen
        verb = "stored as the collection's default" if report.applied else "(not applied)"
        print(
            f"cheapest meeting the target: {c.knob}={c.value} recall {c.recall:.3f} "
            f"p99 {c.p99_ms:.1f} ms {verb}"
        )
    finally:
        services.close()
    return 0


def _with_bar(desc: str, vectors: int, work: Callable[[], IndexState]) -> IndexState:
    """Run `work` (an index rebuild) under a bar on stderr that ticks while it runs and
    fills to the index's size when it is done. The build reports no progress of its own, so
    until then the bar shows the elapsed time against the vectors to index."""
    from concurrent.futures import ThreadPoolExecutor
    from concurrent.futures import TimeoutError as FutureTimeout

    from tqdm import tqdm

    with (
        ThreadPoolExecutor(1, thread_name_prefix="cli-rebuild") as pool,
        tqdm(total=vectors, desc=desc, unit="vector", file=sys.stderr) as bar,
    ):
        future = pool.submit(work)
        while True:
            try:
                state = future.result(timeout=0.2)
                break
            except FutureTimeout:
                bar.refresh()
        bar.total = max(vectors, state.count)
        bar.update(state.count)
    return state


def _progress(desc: str):  # type: ignore[no-untyped-def]
    def wrap(items):  # type: ignore[no-untyped-def]
        try:
            from tqdm import tqdm
        except ImportError:
            return items
        return tqdm(list(items), desc=desc, file=sys.stderr)

    return wrap


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rag", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("serve", help="run the API (and an in-process ingest worker)")
    p.add_argument("--host")
    p.add_argument("--port", type=int)
    p.add_argument("--no-worker", action="store_true", help="do not run a worker in-process")
    p.set_defaults(func=cmd_serve)

    p = sub.add_parser("worker", help="run an ingest worker")
    p.add_argument("--concurrency", type=int, default=1)
    p.set_defaults(func=cmd_worker)

    p = sub.add_parser("migrate", help="apply database migrations")
    p.add_argument("--revision", default="head")
    p.add_argument("--downgrade", metavar="REVISION")
    p.set_defaults(func=cmd_migrate)

    keys = sub.add_parser("keys", help="manage API keys").add_subparsers(
        dest="keys_cmd", required=True
    )
    p = keys.add_parser("create", help="create a key for a tenant (created if new)")
    p.add_argument("--tenant", required=True)
    p.add_argument("--admin", action="store_true")
    p.set_defaults(func=cmd_keys_create)

    index = sub.add_parser("index", help="vector index maintenance").add_subparsers(
        dest="index_cmd", required=True
    )
    p = index.add_parser("rebuild", help="rebuild a collection's index from SQL and swap it in")
    p.add_argument("collection", help="collection id")
    p.add_argument(
        "--kind",
        choices=["auto", "exact", "hnsw", "faiss_flat", "faiss_ivf", "faiss_ivf_sq8", "faiss_hnsw"],
    )
    p.add_argument("--params", help="build parameters as JSON, e.g. '{\"m\": 32}'")
    p.set_defaults(func=cmd_index_rebuild)

    p = sub.add_parser("tune", help="measure recall vs latency over a sweep of knobs")
    p.add_argument("collection", help="collection id")
    p.add_argument("--target-recall", type=float, default=0.95)
    p.add_argument("--budget-ms", type=float, help="p99 latency the setting must stay under")
    p.add_argument("--k", type=int, default=10)
    p.add_argument("--queries", help="a file of queries (lines, or JSONL with 'text')")
    p.add_argument("-n", type=int, default=200, help="queries sampled from the collection")
    p.add_argument("--png", help="where to draw the curve (default: data/tune/<id>.png)")
    p.add_argument("--apply", action="store_true", help="store the chosen setting")
    p.set_defaults(func=cmd_tune)

    for module in ("rag.engine.cli", "rag.ask_cli", "rag.eval_cli", "rag.ingest_cli"):
        try:
            register = __import__(module, fromlist=["register"]).register
        except ImportError:
            continue
        register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command in ("generate", "bench-engine"):
        args.settings = _settings()
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
