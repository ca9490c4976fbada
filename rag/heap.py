"""The long-lived objects of a serving process kept out of the garbage collector's way.

A full (generation 2) collection walks every tracked object while it holds the GIL, so the
event loop and every request thread wait for it. Most of a serving process's objects are
loaded once and live as long as it does (the models, their tokenizers' tables, the imported
modules), and each full collection walked all of them again. `freeze()` moves every object
alive at that moment into the collector's permanent generation: later collections walk only
what requests and background work created since. `bench/abuse.py` measures the event loop's
longest stall (`loop_stall_max_ms`).

Only a process's entry point decides this (`rag serve` does, after start-up and again once
the generator is loaded): objects frozen while alive are never collected as cycles, so a
process that builds and drops many services (a test run) must not.
"""

from __future__ import annotations

import gc


def freeze(*, collect: bool = True) -> int:
    """Collect what start-up left behind (unless `collect` is False: a full collection while
    requests are served is itself the stall this avoids), then freeze every object alive now;
    how many objects the permanent generation holds."""
    if collect:
        gc.collect()
    gc.freeze()
    return gc.get_freeze_count()
