"""docs/alerts.yml: promtool accepts the rules and its unit tests pass, and every metric the
rules name is one the service exports."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parents[2] / "docs"


def _promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        reason = "promtool not found: apt-get install prometheus"
        if os.environ.get("CI"):
            pytest.fail(reason)  # in CI the rules must be checked
        pytest.skip(reason)
    return found


@pytest.mark.parametrize(
    "args", [["check", "rules", "alerts.yml"], ["test", "rules", "alerts.test.yml"]]
)
def test_promtool_accepts_the_rules(args: list[str]) -> None:
    run = subprocess.run([_promtool(), *args], cwd=DOCS, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stdout + run.stderr


def test_the_rules_name_only_metrics_the_service_exports() -> None:
    rules = (DOCS / "alerts.yml").read_text()
    named = set(re.findall(r"\b(rag_[a-z_]+)", rules))
    source = (Path(__file__).resolve().parents[2] / "rag" / "ops" / "metrics.py").read_text()
    exported = set(re.findall(r'"(rag_[a-z_]+)"', source))
    # prometheus_client adds _total to counters, _bucket/_count/_sum to histograms.
    known = exported | {n + s for n in exported for s in ("_total", "_bucket", "_count", "_sum")}
    assert named and named <= known, named - known
