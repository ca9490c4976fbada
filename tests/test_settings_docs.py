"""README.md and docs/settings.md name every setting by its environment variable, so the
documentation cannot drift from rag.config: README the settings a deployment configures,
docs/settings.md those and every `advanced` group (`python -m rag.config.docs --write`)."""

from __future__ import annotations

from pathlib import Path

from rag.config.docs import markdown, moved, settings
from rag.deprecated import env_name

ROOT = Path(__file__).resolve().parents[1]


def _missing(names: list[str], text: str) -> list[str]:
    return [name for name in names if f"`{name}`" not in text]


def test_readme_names_every_user_setting() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    users = [s.env for s in settings() if not s.advanced]
    assert users and _missing(users, readme) == []


def test_readme_names_no_advanced_setting_by_its_old_name() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert [env_name(old) for old, _ in moved() if f"`{env_name(old)}`" in readme] == []


def test_docs_settings_names_every_setting() -> None:
    docs = (ROOT / "docs" / "settings.md").read_text(encoding="utf-8")
    every = [s.env for s in settings()]
    assert any(".advanced." in s.path for s in settings())
    assert _missing(every, docs) == []


def test_docs_settings_is_what_the_generator_writes() -> None:
    docs = (ROOT / "docs" / "settings.md").read_text(encoding="utf-8")
    assert docs == markdown(), "run `python -m rag.config.docs --write`"
