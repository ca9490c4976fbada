"""The generator engine benches together, in one process (what `rag bench-engine` runs):
each part is a script of its own, which says what it measures.

- matmul: bench/engine_matmul.py, the CPU kernels per weight format and whole engine steps;
- single: bench/engine_single.py, one stream against llama.cpp;
- burst: bench/engine_burst.py, a burst of requests against transformers, greedy parity;
- spec: bench/engine_spec.py, speculative decoding's acceptance and speed-up;
- itl: bench/engine_itl.py, inter-token latency targets and what each costs;
- accuracy: bench/engine_accuracy.py, perplexity, greedy agreement and answer F1 per format.

Every part's flags are taken here; `--parts` picks which run (all by default). Markdown
tables first, the FIGURE lines last. Timings need a quiet machine; accuracy figures do not.

    python bench/generate.py --quick                  # every part, reduced sizes
    python bench/generate.py --parts single,accuracy  # a subset, full size

`bench/run_all.py` runs the engine_*.py scripts one by one, not this.
"""

from __future__ import annotations

import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent
# Run as a script, or through runpy (`rag bench-engine`), which puts neither folder on the path.
sys.path[:0] = [str(BENCH), str(BENCH.parent)]

import engine_accuracy  # noqa: E402
import engine_burst  # noqa: E402
import engine_itl  # noqa: E402
import engine_matmul  # noqa: E402
import engine_single  # noqa: E402
import engine_spec  # noqa: E402
from _engine import parser, run_parts  # noqa: E402

PARTS = {
    "matmul": engine_matmul,
    "single": engine_single,
    "burst": engine_burst,
    "spec": engine_spec,
    "itl": engine_itl,
    "accuracy": engine_accuracy,
}

if __name__ == "__main__":
    ap = parser(__doc__)
    ap.add_argument("--quick", action="store_true", help="reduced sizes: < 15 min on 2 cores")
    run_parts(ap, PARTS)
