"""`rag ingest PATH... --collection NAME_OR_ID [--wait]`: upload files from the terminal.

In process, it goes through the same code as the API's upload (rag.upload: type detection
from the bytes, one transaction per file: blob + document + job), so a file ingested here is
exactly one uploaded over HTTP; with `--wait` an in-process worker indexes them and a second
bar follows it. With `--url` and `--key` it uploads to a running server instead.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from rag.cli.common import data_settings, offline_services

EXTENSIONS = {".txt", ".text", ".md", ".markdown", ".html", ".htm", ".xhtml", ".pdf", ".docx"}


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("ingest", help="upload files or folders into a collection")
    p.add_argument("paths", nargs="+", metavar="PATH", help="files, or folders to walk")
    p.add_argument("--collection", required=True, help="collection id or name")
    p.add_argument("--tenant", help="tenant name, when several tenants share the name")
    p.add_argument("--wait", action="store_true", help="index them now and wait until done")
    p.add_argument("--url", help="a running ragserve, e.g. http://127.0.0.1:8000")
    p.add_argument("--key", help="API key for --url")
    p.set_defaults(func=cmd_ingest)


def find_files(paths: list[str]) -> Iterator[Path]:
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            for found in sorted(path.rglob("*")):
                if found.is_file() and found.suffix.lower() in EXTENSIONS:
                    yield found
        elif path.is_file():
            yield path
        else:
            raise FileNotFoundError(f"no such file or folder: {raw}")


def upload(
    services: Any, tenant_id: str, collection_id: str, files: list[Path]
) -> tuple[list[str], list[str]]:
    """Add each file (its own transaction); returns (accepted job ids, problems)."""
    from tqdm import tqdm

    from rag.errors import RagError
    from rag.upload.accept import Incoming, accept
    from rag.upload.detect import safe_filename

    limit = services.settings.ingest.max_upload_bytes
    jobs, problems = [], []
    for path in tqdm(files, desc="upload", unit="file", file=sys.stderr):
        data = path.read_bytes()
        try:
            if len(data) > limit:
                raise RagError(f"larger than the {limit} byte limit")
            [accepted] = accept(
                services.db, tenant_id, collection_id,
                [Incoming(safe_filename(path.name), data, None, {})],
                max_attempts=services.settings.ingest.max_attempts,
            )  # fmt: skip
            if accepted.job is not None and not accepted.duplicate:
                jobs.append(accepted.job.id)
        except RagError as exc:
            problems.append(f"{path}: {exc}")
    return jobs, problems


def wait(services: Any, job_ids: list[str], poll_s: float = 0.5) -> dict[str, int]:
    """Follow the jobs until each is finished; returns the count per final state."""
    from tqdm import tqdm

    from rag.db import jobs

    finished: dict[str, str] = {}
    with tqdm(total=len(job_ids), desc="index", unit="file", file=sys.stderr) as bar:
        while len(finished) < len(job_ids):
            pending = [j for j in job_ids if j not in finished]
            done = jobs.finished_states(services.db, pending)
            finished.update(done)
            bar.update(len(done))
            if len(finished) < len(job_ids):
                services.wake_workers()
                time.sleep(poll_s)
    counts: dict[str, int] = {}
    for state in finished.values():
        counts[state] = counts.get(state, 0) + 1
    return counts


def cmd_ingest(args: argparse.Namespace) -> int:
    try:
        files = list(find_files(args.paths))
    except FileNotFoundError as exc:
        sys.exit(f"rag ingest: {exc}")
    if args.url:
        return _remote(args, files)
    from rag.errors import RagError
    from rag.ops.eval import resolve_collection

    settings = data_settings()
    services = offline_services(settings, worker=args.wait)
    try:
        collection = resolve_collection(services, args.collection, args.tenant)
        jobs, problems = upload(services, collection.tenant_id, collection.id, files)
        for problem in problems:
            print(f"skipped {problem}", file=sys.stderr)
        print(f"accepted {len(jobs)} of {len(files)} files into {collection.id}")
        if args.wait and jobs:
            services.start()
            counts = wait(services, jobs)
            print(", ".join(f"{n} {state}" for state, n in sorted(counts.items())))
            return 1 if counts.get("failed") else 0
    except RagError as exc:
        sys.exit(f"rag ingest: {exc}")
    finally:
        services.close()
    return 1 if problems else 0


def _remote(args: argparse.Namespace, files: list[Path]) -> int:
    """Upload to a running server, one file a request (the server's limits apply), then with
    `--wait` long-poll each job."""
    import httpx
    from tqdm import tqdm

    headers = {"Authorization": f"Bearer {args.key}"} if args.key else {}
    base = args.url.rstrip("/")
    problems: list[str] = []
    jobs: list[str] = []
    with httpx.Client(base_url=base, headers=headers, timeout=120) as client:
        found = client.get("/v1/collections")
        if found.status_code != 200:
            sys.exit(f"rag ingest: {base} answered {found.status_code}: {found.text[:200]}")
        by_ref = {c["id"]: c["id"] for c in found.json()["collections"]}
        by_ref.update({c["name"]: c["id"] for c in found.json()["collections"]})
        collection_id = by_ref.get(args.collection)
        if collection_id is None:
            sys.exit(f"rag ingest: no collection {args.collection!r} on {base}")
        for path in tqdm(files, desc="upload", unit="file", file=sys.stderr):
            r = client.post(
                f"/v1/collections/{collection_id}/documents",
                files={"files": (path.name, path.read_bytes())},
            )
            if r.status_code != 202:
                problems.append(f"{path}: {r.json().get('error', {}).get('message', r.text)}")
                continue
            doc = r.json()["documents"][0]
            if doc["job_id"] and not doc["duplicate"]:
                jobs.append(doc["job_id"])
        for problem in problems:
            print(f"skipped {problem}", file=sys.stderr)
        print(f"accepted {len(jobs)} of {len(files)} files into {collection_id}")
        if args.wait and jobs:
            counts: dict[str, int] = {}
            for job_id in tqdm(jobs, desc="index", unit="file", file=sys.stderr):
                state = "queued"
                while state in ("queued", "running"):
                    state = client.get(f"/v1/jobs/{job_id}", params={"wait": 30}).json()["state"]
                counts[state] = counts.get(state, 0) + 1
            print(", ".join(f"{n} {state}" for state, n in sorted(counts.items())))
            return 1 if counts.get("failed") else 0
    return 1 if problems else 0
