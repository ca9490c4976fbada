"""`rag index rebuild|check|repair` and `rag tune`: an operator's commands on indexes."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from rag.cli.common import load_settings, offline_services, progress, with_bar
from rag.index import KINDS


def register(sub: Any) -> None:
    index = sub.add_parser("index", help="vector index maintenance").add_subparsers(
        dest="index_cmd", required=True
    )
    p = index.add_parser("rebuild", help="rebuild a collection's index from SQL and swap it in")
    p.add_argument("collection", help="collection id")
    p.add_argument("--kind", choices=["auto", *KINDS])
    p.add_argument("--params", help="build parameters as JSON, e.g. '{\"m\": 32}'")
    p.set_defaults(func=cmd_index_rebuild)
    for name, text in (
        ("check", "compare indexes with SQL (counts and ids); exit 1 on a mismatch"),
        ("repair", "add what an index misses, erase what SQL no longer holds, snapshot"),
    ):
        p = index.add_parser(name, help=text)
        p.add_argument("collections", nargs="*", help="collection ids (default: every one)")
        p.set_defaults(func=cmd_index_check, repair=name == "repair")

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


def cmd_index_rebuild(args: argparse.Namespace) -> int:
    from rag.db import collections
    from rag.index import build_index

    settings = load_settings()
    services = offline_services(settings)
    try:
        params = json.loads(args.params) if args.params else None
        with services.db.write() as session:
            row = collections.get_live(session, args.collection)
            if row is None:
                sys.exit(f"no collection {args.collection} in {services.db.describe()}")
            kind = args.kind or row.index_kind
            if params is None:
                params = row.index_params if kind == row.index_kind else {}
            if kind != "auto":
                build_index(kind, services.embedder.dim, params)
            collections.set_index_spec(session, row, kind, params)
            expected = collections.chunk_count(session, args.collection)
        t0 = time.perf_counter()
        state = with_bar(
            "rebuild",
            expected,
            # Opening the index (snapshot or SQL) is part of the wait, so it runs under the bar.
            lambda: services.indexes.rebuild(
                args.collection, None if kind == "auto" else kind, params
            ).result(),
            lambda s: s.count,
        )
        took = time.perf_counter() - t0
        print(
            f"rebuilt {args.collection}: {state.kind}, {state.count} vectors, "
            f"watermark {state.watermark}, generation {state.generation} ({took:.1f} s)"
        )
    finally:
        services.close()
    return 0


def cmd_index_check(args: argparse.Namespace) -> int:
    from rag.db import collections
    from rag.errors import Invalid

    settings = load_settings()
    services = offline_services(settings)
    bad = 0
    try:
        ids = list(args.collections)
        if not ids:
            with services.db.read() as session:
                ids = collections.all_live(session)
        for cid in ids:
            try:
                found = (services.indexes.repair if args.repair else services.indexes.check)(cid)
            except Invalid as exc:  # another embedding model: another process's index
                print(f"{cid}: skipped ({exc.message})")
                continue
            bad += not found.ok
            verdict = "ok" if found.ok else ("repaired" if args.repair else "MISMATCH")
            line = (
                f"{cid} {found.kind}: index {found.index_count}, sql {found.sql_count}, "
                f"missing {found.missing}, extra {found.extra}: {verdict}"
            )
            if found.missing_sample:
                line += f"; missing e.g. {list(found.missing_sample[:5])}"
            if found.extra_sample:
                line += f"; extra e.g. {list(found.extra_sample[:5])}"
            print(line)
    finally:
        services.close()
    return 1 if bad and not args.repair else 0


def cmd_tune(args: argparse.Namespace) -> int:
    from rag.ops import tune

    settings = load_settings()
    services = offline_services(settings)
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
            progress=progress("tune"),
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
