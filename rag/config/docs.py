"""The settings reference, docs/settings.md, written from the models themselves, and the names
of the settings this release moved into `advanced` groups (CHANGELOG.md).

``python -m rag.config.docs`` prints the reference; ``--moved`` prints the moves.
tests/test_settings_docs.py checks that README.md and docs/settings.md name every setting.
"""

from __future__ import annotations

import inspect
import re
import sys
import typing
from dataclasses import dataclass
from enum import Enum
from pathlib import Path, PurePath

from pydantic import BaseModel, SecretStr
from pydantic.fields import FieldInfo

from rag.config import Settings
from rag.config.serving import REMOVED_API, REMOVED_ASK
from rag.deprecated import env_name

# Settings removed in this release (accepted, and ignored, with a warning for one release).
REMOVED = {f"ask.{name}": why for name, why in REMOVED_ASK.items()} | {
    f"api.{name}": why for name, why in REMOVED_API.items()
}

# One line for the settings whose source has no comment of their own (several share one).
_LINES = {
    "data_dir": "Where the SQLite database, index snapshots and the generated admin key live.",
    "log_level": "Python logging level.",
    "log_json": "Log one JSON object a line.",
    "database.url": (
        "SQLAlchemy URL, e.g. `postgresql+psycopg://user:pw@host/db`; none: SQLite in the data "
        "directory."
    ),
    "database.echo": "Log every SQL statement.",
    "embed.model_path": "A sentence-transformers model folder; none: the bundled all-MiniLM-L6-v2.",
    "embed.device": "Where documents are embedded.",
    "embed.batch_size": "Chunks embedded in one call while ingesting.",
    "embed.advanced.ingest_yield_ms": (
        "With query_priority: the longest ingest waits for queries before one batch."
    ),
    "ingest.max_upload_mb": "The most one upload request may carry (413 past it).",
    "ingest.max_files_per_request": "Files one upload request may carry.",
    "ingest.max_text_chars": "Text one document may hold once parsed; a longer one fails.",
    "ingest.chunk_tokens": "A new collection's default chunk size, in tokens.",
    "ingest.chunk_overlap": (
        "A new collection's default overlap between chunks, in tokens (below chunk_tokens)."
    ),
    "ingest.parse_timeout_s": (
        "How long parsing one document may take (it runs in a child process)."
    ),
    "ingest.parse_memory_mb": "Memory the parser's child process may use.",
    "ingest.max_pages": "The most pages a PDF may have; one with more fails.",
    "ingest.in_process_worker": (
        "Run an ingest worker inside `rag serve` (false: run `rag worker`)."
    ),
    "ingest.advanced.claim_bytes": (
        "A claim stops at this many bytes of documents (a larger document is taken alone)."
    ),
    "ingest.advanced.backoff_max_s": "The longest wait between two attempts of a job.",
    "index.keep_generations": "Snapshot generations kept on disk.",
    "milvus.db_name": "The Milvus database; empty: its default.",
    "milvus.call_timeout_s": "The timeout of every Milvus call but a search.",
    "search.default_k": "Results of a search that sets no k.",
    "search.max_query_chars": "The longest search query (422 past it).",
    "purge.enabled": "Erase what deletes leave behind; false: deletes only tombstone.",
    "purge.interval_s": "How often each process runs a purge round.",
    "quota.max_collections": "Live collections per tenant.",
    "quota.max_documents": "Live documents per tenant.",
    "quota.max_conversation_mb": "Bytes of the text of a tenant's stored conversations' turns.",
    "engine.backend": (
        "`local`: the bundled paged-KV engine; `remote`: an OpenAI-compatible server."
    ),
    "engine.device": "Where the local engine runs.",
    "engine.kv_cache_mb": "Memory of the paged KV cache.",
    "engine.remote_model": "The model name sent to the remote server.",
    "engine.remote_api_key": "The remote server's API key.",
    "engine.remote_timeout_s": "The timeout of one request to the remote server.",
    "engine.remote_max_concurrency": "Requests in flight to the remote server at once.",
    "engine.advanced.block_size": "Tokens per KV cache block.",
    "engine.advanced.enable_prefix_caching": "Reuse the KV blocks of an identical prompt prefix.",
    "ask.default_k": "Passages an answer is given when the request sets no k.",
    "ask.hybrid": (
        "Keyword (BM25) weight of the passages an answer reads when neither the request nor the "
        "collection sets `hybrid` (0: dense only)."
    ),
    "ask.default_max_tokens": "Tokens an answer may generate when the request sets no max_tokens.",
    "ask.max_tokens_limit": "The most max_tokens a request may ask for.",
    "ask.max_question_chars": "The longest question (422 past it).",
    "ask.mode": (
        "`generate`: the quote that answers plus the generator's sentence; `extractive`: quoted "
        "sentences, no generator."
    ),
    "ask.extract_words": "Extractive answers: about this many words at most.",
    "ask.max_history_turns": "Earlier turns one request's history may carry (413 past it).",
    "ask.max_history_chars": "Characters of one request's history (413 past it).",
    "ask.prompt_turns": "Earlier turns the prompt carries after the passages.",
    "ask.prompt_turn_chars": "Characters of each earlier turn the prompt carries.",
    "ask.advanced.frequency_penalty": "OpenAI's frequency penalty, over the answer's own tokens.",
    "ask.advanced.presence_penalty": "OpenAI's presence penalty, over the answer's own tokens.",
    "ask.advanced.repetition_penalty": "Hugging Face's repetition penalty (1: none).",
    "ask.advanced.stop_repetition": (
        "End an answer that repeats itself (finish reason `repetition`)."
    ),
    "api.host": "Address `rag serve` listens on.",
    "api.port": "Port `rag serve` listens on.",
    "api.long_poll_max_s": "The longest a long poll (`?wait=`) is held.",
    "api.tenant_requests": "Requests of one tenant in progress at once; beyond it 429.",
    "api.advanced.search_threads": "Threads for searches.",
    "api.advanced.db_threads": (
        "Threads for other database work (listings, collections, documents, jobs)."
    ),
    "api.advanced.auth_threads": "Threads for key lookups.",
    "api.advanced.thread_queue": "Requests that may wait for those threads in all (then 429).",
    "api.advanced.tenant_queue": (
        "Requests of one tenant that may wait for those threads (then 429)."
    ),
    "api.advanced.refusals_per_s": (
        "A tenant's 429s answered a second (after a burst of as many); the next waits its turn."
    ),
    "api.advanced.probes_per_s": (
        "Requests outside /v1 (no key) from one address a second; the next waits its turn."
    ),
    "api.advanced.long_poll_first_s": "A long poll looks at its job first after this long.",
    "api.advanced.long_poll_every_s": "Then less often (x1.5 a time), at least this often.",
    "api.advanced.keep_alive_s": "How long an idle keep-alive connection stays open.",
    "quality.drift.reference_size": (
        "Questions in the reference window (the first of a collection, or pinned)."
    ),
    "quality.drift.window": "Questions in the recent window tested against the reference.",
    "quality.drift.advanced.permutations": "Permutations of the test's threshold.",
    "quality.drift.advanced.consecutive": "Tests past the threshold in a row that raise the alert.",
    "quality.advanced.flush_s": "How often the writer writes a batch.",
    "quality.advanced.topics_max_questions": (
        "Unanswered topics cluster at most this many of the latest questions."
    ),
}
_FIELD = re.compile(r"^    (\w+): ")


@dataclass(frozen=True)
class Setting:
    path: str  # e.g. "ask.advanced.cite_mask"
    default: str
    line: str  # what it does, in one line

    @property
    def env(self) -> str:
        return env_name(self.path)

    @property
    def advanced(self) -> bool:
        return ".advanced." in self.path


def settings(model: type[BaseModel] = Settings, prefix: str = "") -> list[Setting]:
    """Every setting under `model`, in the order the models declare them."""
    comments = _comments(model)
    out: list[Setting] = []
    for name, field in model.model_fields.items():
        kind = field.annotation
        if isinstance(kind, type) and issubclass(kind, BaseModel):
            out += settings(kind, f"{prefix}{name}.")
        else:
            said = _LINES.get(prefix + name) or field.description or comments.get(name, "")
            line = _first_sentence(said)
            out.append(Setting(prefix + name, _default(field), line + _choices(kind)))
    return out


def moved() -> list[tuple[str, str]]:
    """(old path, new path) of every setting that now sits in an `advanced` group."""
    return [(s.path.replace(".advanced.", "."), s.path) for s in settings() if s.advanced]


def markdown() -> str:
    """docs/settings.md."""
    groups: dict[str, list[Setting]] = {}
    for s in settings():
        section = s.path.rpartition(".")[0]
        groups.setdefault(section, []).append(s)
    out = [
        "# Settings",
        "",
        "<!-- Written by `python -m rag.config.docs > docs/settings.md`; "
        "tests/test_settings_docs.py checks it names every setting. -->",
        "",
        "Every setting, by section: first those a deployment configures, then the section's",
        "`advanced` group, tuning and research switches whose defaults were chosen by",
        "measurement (docs/decisions.md). Each is read from the environment variable shown",
        "(prefix `RAG_`, `__` between levels); unknown names stop the start. Settings moved",
        "into an `advanced` group in this release are still read from their old names for one",
        "release, with a warning naming the new one (CHANGELOG.md).",
    ]
    for section, rows in groups.items():
        title = section or "top level"
        out += ["", f"## {title}", "", "| variable | default | meaning |", "|---|---|---|"]
        out += [f"| `{s.env}` | {s.default} | {s.line} |" for s in rows]
    return "\n".join(out) + "\n"


def changelog() -> str:
    """The moved and removed settings, as CHANGELOG.md lists them."""
    lines = [f"- `{env_name(old)}` → `{env_name(new)}`" for old, new in moved()]
    lines += [f"- `{env_name(path)}` removed: {why}" for path, why in REMOVED.items()]
    return "\n".join(lines) + "\n"


def _comments(model: type[BaseModel]) -> dict[str, str]:
    """The comment right above each field of `model`'s source, or at the end of its line."""
    try:
        lines = inspect.getsource(model).splitlines()
    except (OSError, TypeError):
        return {}
    out: dict[str, str] = {}
    block: list[str] = []
    for line in lines:
        if line.startswith("    # "):
            block.append(line.strip()[2:])
            continue
        match = _FIELD.match(line)
        if match:
            out[match.group(1)] = " ".join(block) or line.partition("  # ")[2]
        block = []
    return out


def _first_sentence(text: str) -> str:
    text = " ".join(text.split())
    match = re.search(r"(?<!e\.g)(?<!i\.e)(?<=[a-z0-9)\]`'\"])\. ", text)
    text = text[: match.start() + 1] if match else text
    return text.replace("|", "\\|")


def _default(field: FieldInfo) -> str:
    value = field.default
    if value is None:
        return "none"
    if isinstance(value, SecretStr):
        return "(secret)"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, Enum):
        value = value.value
    if isinstance(value, PurePath) and not value.is_absolute():
        return f"`./{value.as_posix()}`"
    return f"`{value}`"


def _choices(kind: object) -> str:
    args = [a for a in typing.get_args(kind) if a is not type(None)]
    if typing.get_origin(kind) is typing.Literal:
        return " One of " + ", ".join(f"`{a}`" for a in args) + "."
    for arg in args:  # Literal[...] | None
        if typing.get_origin(arg) is typing.Literal:
            return _choices(arg)
    return ""


def main(argv: list[str]) -> int:
    if argv[1:] == ["--moved"]:
        sys.stdout.write(changelog())
    elif argv[1:] == ["--write"]:
        Path("docs/settings.md").write_text(markdown(), encoding="utf-8")
    else:
        sys.stdout.write(markdown())
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
