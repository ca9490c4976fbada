"""The Dockerfile's structure (no Docker daemon needed): a builder stage compiles the engine's
kernels ahead of time, and the final image has no compiler and runs as an unprivileged user."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

DOCKERFILE = Path(__file__).resolve().parents[2] / "Dockerfile"
COMPILERS = re.compile(
    r"(?<![\w.+-])(g\+\+|gcc|clang|c\+\+|cc|build-essential|cmake|make)(-[\d.]+)?(?![\w.+-])"
)


@dataclass
class Stage:
    base: str
    name: str | None
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def all(self, keyword: str) -> list[str]:
        return [arg for kw, arg in self.instructions if kw == keyword]


def parse(text: str) -> list[Stage]:
    """Instructions by stage, with line continuations joined and comments dropped."""
    logical: list[str] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        logical.append(pending + line)
        pending = ""
    stages: list[Stage] = []
    for line in logical:
        keyword, _, arg = line.partition(" ")
        keyword = keyword.upper()
        if keyword == "FROM":
            parts = arg.split()
            name = parts[2] if len(parts) >= 3 and parts[1].upper() == "AS" else None
            stages.append(Stage(parts[0], name))
        else:
            assert stages, f"{keyword} before FROM"
            stages[-1].instructions.append((keyword, arg))
    return stages


def test_a_builder_stage_compiles_the_kernels_ahead_of_time() -> None:
    stages = parse(DOCKERFILE.read_text())
    assert len(stages) >= 2
    builder = next(s for s in stages if s.name == "builder")
    runs = " ".join(builder.all("RUN"))
    assert "python -m rag.engine.kernels" in runs
    assert COMPILERS.search(runs), "the builder installs the compiler the kernels need"
    assert any("TORCH_EXTENSIONS_DIR=" in env for env in builder.all("ENV"))


def test_the_final_image_has_no_compiler_and_is_not_root() -> None:
    final = parse(DOCKERFILE.read_text())[-1]
    for run in final.all("RUN"):
        installed = " ".join(re.findall(r"apt-get install ([^&;]*)", run))
        assert not COMPILERS.search(installed), run
        assert "rag.engine.kernels" not in run  # nothing is compiled here
    copied = " ".join(final.all("COPY"))
    assert "--from=builder" in copied and "/opt/torch_extensions" in copied
    users = final.all("USER")
    assert users and users[-1].split(":")[0] not in ("root", "0")
    keywords = [kw for kw, _ in final.instructions]
    assert keywords.index("USER") < keywords.index("CMD")  # the service runs as that user
    assert any("TORCH_EXTENSIONS_DIR=/opt/torch_extensions" in env for env in final.all("ENV"))


def test_the_parser_sees_stages_and_continuations() -> None:
    stages = parse('FROM a AS builder\n# note\nRUN x \\\n && y\nFROM b\nUSER app\nCMD ["run"]\n')
    assert [(s.base, s.name) for s in stages] == [("a", "builder"), ("b", None)]
    assert stages[0].all("RUN") == ["x  && y"]
    assert stages[1].all("USER") == ["app"]
