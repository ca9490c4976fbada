"""One daemon thread that runs a component's loop until the component is closed."""

from __future__ import annotations

import threading
from collections.abc import Callable


class Thread:
    """`start()` runs `target` in a daemon thread named `name`; `close()` sets `stop` (which
    the loop watches) and waits for it to end."""

    def __init__(self, name: str, target: Callable[[], None]) -> None:
        self.name = name
        self.target = target
        self.stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self.target, name=self.name, daemon=True)
            self._thread.start()

    def close(self, timeout_s: float = 30.0) -> None:
        self.stop.set()
        if self._thread is not None:
            self._thread.join(timeout=timeout_s)
            self._thread = None
