"""Settings moved or removed in this release. Each is still accepted for one release, with a
warning that names where it went, so that a deployment setting one keeps starting (settings
forbid unknown keys); CHANGELOG.md lists them."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, ClassVar

from pydantic import BaseModel, model_validator

log = logging.getLogger(__name__)


def env_name(path: str) -> str:
    """The environment variable pydantic-settings reads the setting at `path` from."""
    return "RAG_" + path.replace(".", "__").upper()


def upgrade(section: str, data: Any, moved: frozenset[str], removed: Mapping[str, str]) -> Any:
    """`data` (a section's raw settings) with each of `moved` put under its `advanced` group
    and each of `removed` dropped, a warning logged for each."""
    if not isinstance(data, dict) or not (data.keys() & (moved | removed.keys())):
        return data
    data = dict(data)
    for key in data.keys() & removed.keys():
        del data[key]
        name = f"{section}.{key}"
        log.warning("setting %s (%s) is ignored: %s", name, env_name(name), removed[key])
    old = sorted(data.keys() & moved)
    if old:
        group = data.get("advanced") or {}
        group = dict(
            group.model_dump(exclude_unset=True) if isinstance(group, BaseModel) else group
        )
        for key in old:
            value = data.pop(key)
            group.setdefault(key, value)  # the new name wins where both are set
            new = f"{section}.advanced.{key}"
            log.warning("setting %s (%s) is now %s (%s)", f"{section}.{key}",
                        env_name(f"{section}.{key}"), new, env_name(new))  # fmt: skip
        data["advanced"] = group
    return data


class Upgrading(BaseModel):
    """A settings section with an `advanced` group: the names of that group's fields, and
    those in `removed`, are still accepted at the section's top level (`upgrade`)."""

    path: ClassVar[str]  # where the section sits in Settings, e.g. "quality.drift"
    removed: ClassVar[Mapping[str, str]] = {}  # name -> why it went

    @model_validator(mode="before")
    @classmethod
    def _upgrade(cls, data: Any) -> Any:
        group = cls.model_fields["advanced"].annotation
        assert isinstance(group, type) and issubclass(group, BaseModel)
        return upgrade(cls.path, data, frozenset(group.model_fields), cls.removed)
