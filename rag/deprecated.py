"""Settings moved or removed in this release. Each is still accepted for one release, with a
warning that names where it went, so that a deployment setting one keeps starting (settings
forbid unknown keys); CHANGELOG.md lists them."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel

log = logging.getLogger(__name__)


def _env(path: str) -> str:
    return "RAG_" + path.replace(".", "__").upper()


def upgrade(section: str, data: Any, moved: frozenset[str], removed: Mapping[str, str]) -> Any:
    """`data` (a section's raw settings) with each of `moved` put under its `advanced` group
    and each of `removed` dropped, a warning logged for each."""
    if not isinstance(data, dict) or not (data.keys() & (moved | removed.keys())):
        return data
    data = dict(data)
    for key in data.keys() & removed.keys():
        del data[key]
        log.warning("setting %s (%s) is ignored: %s", f"{section}.{key}", _env(f"{section}.{key}"),
                    removed[key])  # fmt: skip
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
                        _env(f"{section}.{key}"), new, _env(new))  # fmt: skip
        data["advanced"] = group
    return data
