"""`rag eval COLLECTION --queries FILE [--qrels FILE] [--answers FILE] [--k 10] [--json]`."""

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
    p.set_defaults(func=cmd_eval)


def cmd_eval(args: argparse.Namespace) -> int:
    from rag.errors import RagError
    from rag.ops import eval as evaluation

    settings = data_settings()
    queries_path = Path(args.queries)
    qrels_path = Path(args.qrels) if args.qrels else queries_path.with_name("qrels.tsv")
    services = offline_services(settings)
    try:
        collection = evaluation.resolve_collection(services, args.collection, args.tenant)
        report = evaluation.evaluate(
            services,
            collection,
            evaluation.read_queries(queries_path),
            evaluation.read_qrels(qrels_path),
            k=args.k,
            answers=evaluation.read_answers(Path(args.answers)) if args.answers else None,
            progress=progress("eval"),
        )
    except (RagError, OSError) as exc:
        sys.exit(f"rag eval: {exc}")
    finally:
        services.close()
    print(json.dumps(report.as_dict(), indent=2) if args.json else report.table())
    return 0
