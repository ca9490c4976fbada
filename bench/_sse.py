"""Server-sent events of a streamed answer (/ask with stream: true), as the benches read them."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx


def events(response: httpx.Response) -> Iterator[tuple[str, dict[str, Any]]]:
    """(event name, its JSON data) for each event of a streamed response, as it arrives."""
    event = ""
    for line in response.iter_lines():
        if line.startswith("event:"):
            event = line[6:].strip()
        elif line.startswith("data:"):
            yield event, json.loads(line[5:])
