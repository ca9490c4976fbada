"""Real all-MiniLM-L6-v2 vectors for the index contract suite.

The texts are paragraphs of the standard library's own docstrings, so they exist on any fresh
machine; the vectors are cached across runs under pytest's temporary root.
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
import re
import warnings
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import pytest

N_CORPUS = 1500
N_QUERIES = 150

# fmt: off
_MODULES = (
    "os", "re", "json", "collections", "itertools", "functools", "pathlib", "string",
    "textwrap", "datetime", "decimal", "fractions", "random", "statistics", "math", "heapq",
    "bisect", "array", "shutil", "tempfile", "glob", "fnmatch", "csv", "configparser",
    "logging", "argparse", "threading", "queue", "subprocess", "socket", "email",
    "http.client", "urllib.parse", "unittest", "doctest", "inspect", "typing", "dataclasses",
    "enum", "contextlib", "abc", "copy", "pprint", "zipfile", "tarfile", "gzip", "hashlib",
    "hmac", "secrets", "base64", "struct", "codecs", "io", "pickle", "sqlite3", "calendar",
    "locale", "gettext", "difflib", "ast", "dis", "tokenize", "asyncio", "concurrent.futures",
    "multiprocessing", "selectors", "signal", "mmap", "ftplib", "smtplib", "uuid",
    "ipaddress", "zlib", "lzma", "bz2", "shelve", "platform", "sysconfig", "warnings",
    "traceback", "weakref", "types", "operator", "numbers", "cmath", "optparse", "getopt",
    "sched", "timeit", "trace", "pdb", "cProfile", "wave", "colorsys", "imaplib", "poplib",
    "mailbox", "mimetypes", "html.parser", "pkgutil", "runpy", "importlib", "filecmp", "stat",
    "netrc", "plistlib", "quopri", "binascii", "graphlib", "reprlib", "unicodedata",
    "symtable", "keyword", "token", "tabnanny", "pyclbr", "py_compile", "compileall", "code",
    "codeop",
)
# fmt: on

# fmt: off
_WORDS = (
    "index", "vector", "search", "query", "cluster", "graph", "node", "edge", "layer",
    "memory", "disk", "file", "snapshot", "record", "table", "column", "row", "token",
    "model", "batch", "thread", "lock", "queue", "worker", "lease", "job", "parse", "chunk",
    "embed", "rank", "score", "filter", "tenant", "document", "collection", "budget",
    "latency", "recall",
)
# fmt: on


def docstring_paragraphs() -> list[str]:
    """Deterministic short texts from docstrings of installed standard-library modules."""
    seen: set[str] = set()
    out: list[str] = []
    for name in _MODULES:
        try:
            module = importlib.import_module(name)
        except Exception:
            continue
        objects = [module] + [getattr(module, a, None) for a in sorted(dir(module))]
        for obj in objects:
            if obj is not module and getattr(obj, "__module__", None) != module.__name__:
                continue
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    doc = inspect.getdoc(obj)
            except Exception:
                doc = None
            for para in re.split(r"\n\s*\n", doc or ""):
                para = " ".join(para.split())
                if 40 <= len(para) <= 600 and para not in seen:
                    seen.add(para)
                    out.append(para)
    # Another Python may have fewer docstrings: top up with sentences from a word list.
    rng = np.random.default_rng(0)
    while len(out) < N_CORPUS + N_QUERIES:
        out.append(" ".join(rng.choice(_WORDS, size=12).tolist()))
    return out


@dataclass(frozen=True)
class MiniLM:
    corpus: npt.NDArray[np.float32]  # [N_CORPUS, 384]
    queries: npt.NDArray[np.float32]  # [N_QUERIES, 384]

    @property
    def ids(self) -> npt.NDArray[np.int64]:
        # Sparse, large labels, like chunk ids after deletes.
        return np.arange(len(self.corpus), dtype=np.int64) * 7 + 1_000_003


@pytest.fixture(scope="session")
def minilm(tmp_path_factory: pytest.TempPathFactory) -> MiniLM:
    texts = docstring_paragraphs()
    step = len(texts) // N_QUERIES
    query_rows = set(range(0, step * N_QUERIES, step))
    # A query is the first words of a held-out paragraph, as a user would type.
    queries = [" ".join(texts[i].split()[:12]) for i in sorted(query_rows)]
    corpus = [t for i, t in enumerate(texts) if i not in query_rows][:N_CORPUS]
    key = hashlib.sha256("\x00".join(corpus + ["--"] + queries).encode()).hexdigest()[:16]
    cache = tmp_path_factory.getbasetemp().parent / "ragserve-minilm-cache" / f"{key}.npz"
    if cache.exists():
        data = np.load(cache, allow_pickle=False)
        return MiniLM(data["corpus"], data["queries"])
    from rag.embed import SentenceTransformerEmbedder

    embedder = SentenceTransformerEmbedder(device="cpu")
    result = MiniLM(embedder.embed(corpus), embedder.embed(queries))
    cache.parent.mkdir(parents=True, exist_ok=True)
    tmp = cache.with_suffix(".tmp.npz")
    np.savez(tmp, corpus=result.corpus, queries=result.queries)
    tmp.replace(cache)
    return result
