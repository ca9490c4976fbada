"""The `rag` command. Each module registers its commands; every command imports what it needs
when it runs, so `rag --help` stays instant."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from rag.cli import ask, eval, generate, index, ingest, serve


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rag", description="ragserve: private documents in, grounded answers out."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for module in (serve, index, ask, eval, ingest, generate):
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


__all__ = ["build_parser", "main"]
