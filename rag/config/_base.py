"""What every settings section shares."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Section(BaseModel):
    """A section of Settings: unknown options fail at startup."""

    model_config = ConfigDict(extra="forbid")
