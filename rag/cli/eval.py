"""`rag eval COLLECTION --queries FILE [--qrels FILE] [--answers FILE] [--k 10] [--json]
[--choose-hybrid [--apply]]`, or `rag eval COLLECTION --from-feedback [--out DIR]` (the set
made from rated answers); either with `--candidate KNOBS` to measure a change of search
settings beside the current ones."""

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
    p.add_argument("--queries", help="queries.jsonl: {'_id', 'text'} per line")
    p.add_argument(
        "--from-feedback",
        action="store_true",
        help="make the set from the collection's rated answers (up: the answer and its "
        "passages' documents; down: the correction given), write it to --out, and run it",
    )
    p.add_argument(
        "--out", help="with --from-feedback: where the set goes (default data/eval/<collection>)"
    )
    p.add_argument(
        "--candidate",
        help="search knobs to measure beside the collection's own, as JSON, e.g. "
        "'{\"hybrid\": 0.15}' or '{\"ef_search\": 32}': a settings change checked before it "
        "is applied",
    )
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
    from rag.ops.feedback_eval import from_feedback

    if args.apply and not args.choose_hybrid:
        sys.exit("rag eval: --apply stores what --choose-hybrid chose; give both")
    if bool(args.queries) == bool(args.from_feedback):
        sys.exit("rag eval: give --queries FILE, or --from-feedback")
    candidate = _knobs(args.candidate) if args.candidate else None
    settings = data_settings()
    services = offline_services(settings)
    try:
        collection = evaluation.resolve_collection(services, args.collection, args.tenant)
        answers_path = Path(args.answers) if args.answers else None
        if args.from_feedback:
            made = from_feedback(services, collection)
            out = Path(args.out) if args.out else settings.data_dir / "eval" / collection.id
            queries_path = made.write(out)
            answers_path = out / "answers.jsonl" if made.answers else None
            print(
                f"{len(made.queries)} rated answers -> {out} ({len(made.qrels)} with relevant "
                f"documents, {len(made.answers)} with reference answers; skipped "
                f"{made.skipped_no_text} without question text, {made.skipped_no_correction} "
                "rated down without a correction)",
                file=sys.stderr,
            )
        else:
            queries_path = Path(args.queries)
        qrels_path = Path(args.qrels) if args.qrels else queries_path.with_name("qrels.tsv")
        queries = evaluation.read_queries(queries_path)
        qrels = evaluation.read_qrels(qrels_path)
        report = evaluation.evaluate(
            services,
            collection,
            queries,
            qrels,
            k=args.k,
            answers=evaluation.read_answers(answers_path) if answers_path else None,
            progress=progress("eval"),
            candidate=candidate,
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


def _knobs(text: str) -> Any:
    from rag.errors import Invalid
    from rag.knobs import Knobs

    try:
        values = json.loads(text)
        if not isinstance(values, dict):
            raise ValueError
        return Knobs(**values)
    except (ValueError, TypeError, Invalid) as exc:
        sys.exit(f"rag eval: --candidate takes search knobs as a JSON object ({exc})")
