"""`rag eval COLLECTION --queries FILE [--qrels FILE] [--answers FILE] [--k 10] [--json]
[--choose-hybrid [--apply]]`."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from rag.cli.common import data_settings, offline_services, progress


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "eval", help="retrieval (and answer) quality against BEIR-style judgements"
    )
    p.add_argument("collection", help="collection id or name")
    p.add_argument("--queries", required=True, help="queries.jsonl: {'_id', 'text'} per line")
    p.add_argument(
        "--qrels", help="qrels.tsv: 'query-id corpus-id score' (default: qrels.tsv beside queries)"
    )
    p.add_argument("--answers", help="answers.jsonl: {'_id', 'answer'} per line")
    p.add_argument("--k", type=int, default=10, help="k of recall@k (default 10)")
    p.add_argument("--tenant", help="tenant name, when several tenants share the name")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument(
        "--choose-hybrid",
        action="store_true",
        help="compare keyword (hybrid) weights: chosen on the even-numbered queries, kept only "
        "if the odd-numbered ones do at least as well as dense search",
    )
    p.add_argument(
        "--apply", action="store_true", help="with --choose-hybrid: store it as the default"
    )
    p.set_defaults(func=cmd_eval)


def cmd_eval(args: argparse.Namespace) -> int:
    from rag.errors import RagError
    from rag.ops import eval as evaluation

    if args.apply and not args.choose_hybrid:
        sys.exit("rag eval: --apply stores what --choose-hybrid chose; give both")
    settings = data_settings()
    queries_path = Path(args.queries)
    qrels_path = Path(args.qrels) if args.qrels else queries_path.with_name("qrels.tsv")
    services = offline_services(settings)
    try:
        collection = evaluation.resolve_collection(services, args.collection, args.tenant)
        queries = evaluation.read_queries(queries_path)
        qrels = evaluation.read_qrels(qrels_path)
        report = evaluation.evaluate(
            services,
            collection,
            queries,
            qrels,
            k=args.k,
            answers=evaluation.read_answers(Path(args.answers)) if args.answers else None,
            progress=progress("eval"),
        )
        if args.choose_hybrid:
            report.hybrid = evaluation.choose_hybrid(
                services, collection, queries, qrels, apply=args.apply, progress=progress("hybrid")
            )
    except (RagError, OSError) as exc:
        sys.exit(f"rag eval: {exc}")
    finally:
        services.close()
    print(json.dumps(report.as_dict(), indent=2) if args.json else report.table())
    return 0
