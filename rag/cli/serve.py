"""`rag serve`, `rag worker`, `rag migrate`, `rag keys create`."""

from __future__ import annotations

import argparse
import signal
import threading
from typing import Any

from rag.cli.common import load_settings, offline_services, record_serve


def register(sub: Any) -> None:
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


def cmd_serve(args: argparse.Namespace) -> int:
    import uvicorn

    from rag.api.app import create_app
    from rag.ops import logs

    settings = load_settings()
    if args.no_worker:
        settings.ingest.in_process_worker = False
    logs.setup(settings.log_level, settings.log_json)
    host, port = args.host or settings.api.host, args.port or settings.api.port
    record_serve(settings, f"http://{host}:{port}")
    app = create_app(settings, freeze_heap=True)
    uvicorn.run(
        app, host=host, port=port, log_level=settings.log_level.lower(), access_log=False,
        timeout_keep_alive=settings.api.advanced.keep_alive_s,
    )  # fmt: skip
    return 0


def cmd_worker(args: argparse.Namespace) -> int:
    from rag.ops import logs
    from rag.services import make_worker

    settings = load_settings()
    logs.setup(settings.log_level, settings.log_json)
    # A worker embeds documents, never search queries: no ONNX export for queries at start.
    settings.embed.advanced.query_backend = "torch"
    services = offline_services(settings)
    workers = [make_worker(services) for _ in range(args.concurrency)]
    stop = threading.Event()

    def _stop(*_: object) -> None:
        stop.set()
        for w in workers:
            w.wake.set()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    threads = [w.start_thread(stop) for w in workers]
    services.start_purger()  # workers purge too (several purgers share the work)
    while any(t.is_alive() for t in threads):
        for t in threads:
            t.join(timeout=0.5)
    services.close()
    return 0


def cmd_migrate(args: argparse.Namespace) -> int:
    from rag.db import Database
    from rag.db.migrate import downgrade, upgrade

    settings = load_settings()
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

    settings = load_settings()
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    db = Database(settings.database_url)
    upgrade(db)
    key, tenant_id = create_key(db, args.tenant, is_admin=args.admin)
    print(f"tenant: {args.tenant} ({tenant_id})")
    print(f"key:    {key}")
    print("The key is shown once; only its hash is stored.")
    return 0
