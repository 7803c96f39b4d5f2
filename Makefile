# Every target works on a fresh machine with Python 3.11+ and Java 17: `install` makes .venv.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PG_URL ?= postgresql+psycopg://postgres@127.0.0.1:5432/test

.PHONY: install demo test test-fast lint bench clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[dev]"
	touch $@

install: $(VENV)/.installed

demo: install
	$(PY) -m examples.streaming_warehouse $(ARGS)

# The whole suite, PostgreSQL tests included (they need METASERVICE_TEST_PG_URL).
test: install
	METASERVICE_TEST_PG_URL=$${METASERVICE_TEST_PG_URL:-$(PG_URL)} $(PY) -m pytest $(PYTEST_ARGS)

test-fast: install
	$(PY) -m pytest -m "not slow and not spark" $(PYTEST_ARGS)

lint: install
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -m mypy

bench: install
	$(PY) -m bench.bench_service --out bench/results/service.json
	$(PY) -m bench.bench_outbox --out bench/results/outbox.json
	$(PY) -m bench.bench_spark --out bench/results/spark.json
	$(PY) -m bench.bench_outage --out bench/results/outage.json

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis demo-warehouse
