#!/usr/bin/env bash
# The engine alone on a CUDA GPU (see bench/gpu_check.py): float32 parity with transformers,
# then bfloat16 tokens/s at batch 1, 16 and 64 against transformers' generate.
#
# Needs: torch with CUDA, transformers, pydantic (+ pydantic-core, annotated-types,
# typing-inspection) and numpy. No model file, no network, no database. Under 5 minutes on
# an H200. Run from the repository root:  bash bench/gpu_check.sh [--quick]
set -euo pipefail
cd "$(dirname "$0")/.."
missing=$(python - <<'PY'
import importlib.util
need = ["torch", "transformers", "pydantic", "numpy"]
print(" ".join(n for n in need if importlib.util.find_spec(n) is None))
PY
)
if [ -n "$missing" ]; then
  echo "missing packages: $missing (bring them as wheels)" >&2
  exit 2
fi
exec python bench/gpu_check.py "$@"
