"""`rag ask COLLECTION "question"`: stream a grounded answer in the terminal, then its sources.

With --url and --key it asks a running server; otherwise it builds the configured services in
this process (the collection is then named by id or by name within --tenant).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import Any

from rag.cli.common import data_settings, offline_services


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("ask", help="ask a collection a question; streams the answer")
    p.add_argument("collection", help="collection id (or name, in-process)")
    p.add_argument("question")
    p.add_argument("--url", help="a running ragserve, e.g. http://127.0.0.1:8000")
    p.add_argument("--key", help="API key for --url")
    p.add_argument("--tenant", default=None, help="in-process: the tenant owning the collection")
    p.add_argument("-k", type=int, default=None, help="passages to retrieve")
    p.add_argument("--max-tokens", type=int, default=None)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--budget-ms", type=float, default=None)
    p.set_defaults(func=cmd_ask)


def cmd_ask(args: argparse.Namespace) -> int:
    body: dict[str, Any] = {"question": args.question, "stream": True}
    for name in ("k", "max_tokens", "temperature", "budget_ms"):
        if getattr(args, name) is not None:
            body[name] = getattr(args, name)
    if args.url:
        return _remote(args, body)
    return asyncio.run(_in_process(args, body))


def _print_final(final: dict[str, Any], passages: list[dict[str, Any]]) -> None:
    print()
    if final.get("citations"):
        print("\nSources:")
        for c in final["citations"]:
            p = passages[c["marker"] - 1] if c["marker"] <= len(passages) else {}
            snippet = " ".join(str(p.get("text", "")).split())[:100]
            print(
                f"  [{c['marker']}] {c['filename']} (document {c['document_id']}, "
                f"chars {c['start_char']}-{c['end_char']}): {snippet}"
            )
    u, t = final.get("usage", {}), final.get("timings_ms", {})
    print(
        f"\n({final.get('finish_reason')}; {u.get('prompt_tokens', 0)} prompt tokens, "
        f"{u.get('cached_tokens', 0)} cached, {u.get('generated_tokens', 0)} generated; "
        f"first token {t.get('first_token', 0):.0f} ms, total {t.get('total', 0):.0f} ms)",
        file=sys.stderr,
    )


def _remote(args: argparse.Namespace, body: dict[str, Any]) -> int:
    import httpx

    headers = {"Authorization": f"Bearer {args.key}"} if args.key else {}
    url = f"{args.url.rstrip('/')}/v1/collections/{args.collection}/ask"
    passages: list[dict[str, Any]] = []
    with httpx.stream("POST", url, json=body, headers=headers, timeout=None) as resp:
        if resp.status_code != 200:
            resp.read()
            print(f"error {resp.status_code}: {resp.text}", file=sys.stderr)
            return 1
        event = ""
        for line in resp.iter_lines():
            if line.startswith("event:"):
                event = line[6:].strip()
            elif line.startswith("data:"):
                data = json.loads(line[5:])
                if event == "passages":
                    passages = data["passages"]
                elif event == "token":
                    print(data["text"], end="", flush=True)
                elif event == "final":
                    _print_final(data, passages)
    return 0


async def _in_process(args: argparse.Namespace, body: dict[str, Any]) -> int:
    from dataclasses import asdict

    from rag.answer import AskRequest, Final, ask, tokens
    from rag.db import collections
    from rag.engine.sequence import SamplingParams
    from rag.errors import NotFound, RagError
    from rag.knobs import Knobs

    settings = data_settings()
    services = offline_services(settings)
    try:
        services.indexes.start(settings.index.catch_up_interval_s)
        with services.db.read() as session:
            if args.tenant:
                row = collections.find_in_tenant_named(session, args.collection, args.tenant)
            else:
                row = collections.find(session, args.collection)
        if row is None:
            raise NotFound(f"no collection {args.collection!r} in {services.db.describe()}")
        req = AskRequest(
            question=args.question,
            knobs=Knobs(k=args.k),
            params=SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature),
            budget_ms=args.budget_ms,
        )
        prep = await ask.prepare(services, row.tenant_id, row.id, req)
        passages = [asdict(p) for p in prep.passages]
        async for item in tokens(services, prep):
            if isinstance(item, Final):
                final = asdict(item)
                final["usage"] = {
                    "prompt_tokens": item.usage.prompt_tokens,
                    "cached_tokens": item.usage.cached_prompt_tokens,
                    "generated_tokens": item.usage.completion_tokens,
                }
                _print_final(final, passages)
            else:
                print(item, end="", flush=True)
        return 0
    except RagError as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        return 1
    finally:
        services.close()
