"""`rag ingest PATH... --collection NAME_OR_ID [--wait]`: upload files from the terminal.

Goes through the same service code as the API's upload (type detection from the bytes, one
transaction per file: blob + document + job), so a file ingested here is exactly one uploaded
over HTTP. With `--wait` an in-process worker indexes them and a second bar follows it.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

EXTENSIONS = {".txt", ".text", ".md", ".markdown", ".html", ".htm", ".xhtml", ".pdf", ".docx"}


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("ingest", help="upload files or folders into a collection")
    p.add_argument("paths", nargs="+", metavar="PATH", help="files, or folders to walk")
    p.add_argument("--collection", required=True, help="collection id or name")
    p.add_argument("--tenant", help="tenant name, when several tenants share the name")
    p.add_argument("--wait", action="store_true", help="index them now and wait until done")
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


def upload(services: Any, collection: Any, files: list[Path]) -> tuple[list[str], list[str]]:
    """Add each file (its own transaction); returns (accepted job ids, problems)."""
    from tqdm import tqdm

    from ingest.detect import detect_media_type, safe_filename
    from rag.db import repo
    from rag.errors import RagError

    limit = services.settings.ingest.max_upload_bytes
    jobs, problems = [], []
    for path in tqdm(files, desc="upload", unit="file", file=sys.stderr):
        data = path.read_bytes()
        name = safe_filename(path.name)
        try:
            if len(data) > limit:
                raise RagError(f"larger than the {limit} byte limit")
            media_type = detect_media_type(data, name, None)
            with services.db.write() as session:
                row = repo.get_collection(session, collection.tenant_id, collection.id)
                accepted = repo.add_document(
                    session,
                    row,
                    filename=name,
                    media_type=media_type,
                    data=data,
                    sha256=hashlib.sha256(data).hexdigest(),
                    meta={},
                    max_attempts=services.settings.ingest.max_attempts,
                )
                if accepted.job is not None and not accepted.duplicate:
                    jobs.append(accepted.job.id)
        except RagError as exc:
            problems.append(f"{path}: {exc}")
    return jobs, problems


def wait(services: Any, job_ids: list[str], poll_s: float = 0.5) -> dict[str, int]:
    """Follow the jobs until each is finished; returns the count per final state."""
    from sqlalchemy import select
    from tqdm import tqdm

    from rag.db.models import IngestJob

    finished: dict[str, str] = {}
    with tqdm(total=len(job_ids), desc="index", unit="file", file=sys.stderr) as bar:
        while len(finished) < len(job_ids):
            pending = [j for j in job_ids if j not in finished]
            with services.db.read() as session:
                rows = session.execute(
                    select(IngestJob.id, IngestJob.state).where(IngestJob.id.in_(pending))
                ).all()
            for job_id, state in rows:
                if state in ("done", "failed", "cancelled"):
                    finished[job_id] = state
                    bar.update(1)
            if len(finished) < len(job_ids):
                services.wake_workers()
                time.sleep(poll_s)
    counts: dict[str, int] = {}
    for state in finished.values():
        counts[state] = counts.get(state, 0) + 1
    return counts


def cmd_ingest(args: argparse.Namespace) -> int:
    from rag.config import Settings
    from rag.errors import RagError
    from rag.eval import resolve_collection
    from rag.services import build_services

    try:
        settings = Settings()
    except Exception as exc:
        sys.exit(f"invalid configuration: {exc}")
    try:
        files = list(find_files(args.paths))
    except FileNotFoundError as exc:
        sys.exit(f"rag ingest: {exc}")
    services = build_services(settings, in_process_worker=args.wait, announce_admin_key=False)
    try:
        collection = resolve_collection(services, args.collection, args.tenant)
        jobs, problems = upload(services, collection, files)
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
