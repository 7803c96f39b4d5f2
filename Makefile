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

# Debian's chromium for the console's browser tests only (playwright drives it; it downloads
# none): the demo needs no browser, so it takes just the virtual environment.
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
install: $(VENV)/.installed
	@command -v chromium >/dev/null || ($(SUDO) apt-get update && $(SUDO) apt-get install -y chromium)

demo: $(VENV)/.installed
	$(PY) -m examples.streaming_warehouse $(ARGS)

# The whole suite, PostgreSQL tests included (they need METASERVICE_TEST_PG_URL), in two
# pytest runs: the tests that need no Spark on TEST_WORKERS processes (pytest-xdist; each
# test has its own database, schema, folders and ports), then the Spark tests (-m spark)
# in one process, since they share one SparkSession and one cluster, and their JVMs want
# both cores. Three workers on two cores: two left 0.7 of a core idle (the tests wait on
# processes, sockets and PostgreSQL), three keep 1.8 busy. Running the Spark tests beside
# the rest was no faster (they slow each other down). README.md gives the current times.
# TEST_WORKERS=0 runs the first part in this process. Exit status 5 (no test selected)
# counts as success.
TEST_WORKERS ?= 3
test: install
	@export METASERVICE_TEST_PG_URL=$${METASERVICE_TEST_PG_URL:-$(PG_URL)}; \
	echo "=============== tests without Spark ($(TEST_WORKERS) workers) ==============="; \
	$(PY) -m pytest -m "not spark" -n $(TEST_WORKERS) $(PYTEST_ARGS); rest=$$?; \
	echo "=============== the Spark tests (pytest -m spark) ==============="; \
	$(PY) -m pytest -m spark $(PYTEST_ARGS); sparks=$$?; \
	echo "without Spark: exit status $$rest; Spark: exit status $$sparks"; \
	[ $$rest = 0 -o $$rest = 5 ] && [ $$sparks = 0 -o $$sparks = 5 ]

test-fast: install
	$(PY) -m pytest -m "not slow and not spark" $(PYTEST_ARGS)

lint: install
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -m mypy

bench: install
	$(PY) -m bench.bench_service --out bench/results/service.json
	$(PY) -m bench.bench_advancer --out bench/results/advancer.json
	$(PY) -m bench.bench_outbox --out bench/results/outbox.json
	$(PY) -m bench.bench_spark --out bench/results/spark.json
	$(PY) -m bench.bench_writer --out bench/results/writer.json
	$(PY) -m bench.bench_freshness --out bench/results/freshness.json
	$(PY) -m bench.bench_expiry --out bench/results/expiry.json
	$(PY) -m bench.bench_revision --out bench/results/revision.json
	$(PY) -m bench.bench_outage --out bench/results/outage.json
	$(PY) -m bench.bench_log --out bench/results/log.json
	$(PY) -m bench.bench_console --out bench/results/console.json
	$(PY) -m bench.bench_openlineage --pg $${METASERVICE_TEST_PG_URL:-$(PG_URL)} --out bench/results/openlineage.json

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis demo-warehouse
