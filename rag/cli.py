"""The `rag` command: serve, worker, migrate, keys, and the engine's commands."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from collections.abc import Sequence

from rag.config import Settings

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

    for module in ("rag.engine.cli",):
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
