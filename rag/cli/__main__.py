"""`python -m rag.cli ...` (how tests and benches start a worker or a server)."""

import sys

from rag.cli import main

sys.exit(main())
