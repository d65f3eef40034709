# Theseus: the two set-up commands are `make demo` and `make test`; both install what they need.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: test test-cluster test-cluster-ci demo kafka kafka-stop cluster cluster-stop bench bench-run \
	bench-migrate bench-fleet bench-cluster bench-recursion bench-tables bench-import bench-sink \
	bench-jvm bench-avro lint docs docs-serve clean registry registry-stop

# make kafka BROKERS=3: a three-node KRaft cluster (RF 3, min.insync.replicas 2) on 29092-29094
BROKERS ?= 1

$(STAMP): pyproject.toml
	@command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || \
	  { echo "installing chromium (headless browser tests)"; \
	    (apt-get update -qq && apt-get install -y -qq chromium) >/dev/null 2>&1 || \
	    echo "warning: could not install chromium"; }
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev,runtime]'
	touch $(STAMP)

# The unit tests on both cores (two workers: 127 s -> 74 s), then the integration tests in
# two runs that together run every file (scripts/it_groups.py): the migrations, fencing and
# wall-clock bounds one test at a time (several drivers each already load both cores), then
# the other files on two workers (four of them: 326 s one at a time, 209 s on two).
test: $(STAMP)
	$(PY) -m pytest -q -n 2 --ignore=tests/integration --durations=10
	$(PY) -m pytest -q --durations=0 --durations-min=15 $$($(PY) scripts/it_groups.py serial)
	$(PY) -m pytest -q -n 2 --dist loadfile --durations=0 --durations-min=15 \
	  $$($(PY) scripts/it_groups.py parallel)

demo: $(STAMP)
	$(PY) scripts/demo.py

kafka:
	@BROKERS=$(BROKERS) bash scripts/kafka.sh start

kafka-stop:
	@BROKERS=$(BROKERS) bash scripts/kafka.sh stop

# A schema registry (Apicurio, in memory, 127.0.0.1:18081) for Avro topics; clients use its
# Confluent-compatible API. SCHEMA_REGISTRY_URL=... points everything at an existing one.
registry:
	@bash scripts/registry.sh start

registry-stop:
	@bash scripts/registry.sh stop

# A Spark standalone cluster (master + 2 workers, one core each) from the PySpark wheel.
cluster: $(STAMP)
	@bash scripts/spark_cluster.sh start

cluster-stop:
	@bash scripts/spark_cluster.sh stop

# Brokers with SASL/SCRAM and ACLs, three brokers, a Spark cluster, faults: tests/cluster/.
# They start and stop what they need on ports of their own (29092+, 27077).
test-cluster: $(STAMP)
	THESEUS_CLUSTER_TESTS=1 $(PY) -m pytest -q -p no:randomly --durations=0 tests/cluster

# A small, robust subset of test-cluster (marker cluster_ci), run by .ci/run after make test:
# the secured broker's refusals (a run, a migration) and exact run, a run on the Spark
# cluster and three brokers with the Kafka store, and a worker killed under a stateful query.
# Its brokers' jars are kafka.sh's (fetched once with Maven into .cache/kafka/libs, as for
# make test's broker).
test-cluster-ci: $(STAMP)
	THESEUS_CLUSTER_TESTS=1 $(PY) -m pytest -q -p no:randomly --durations=0 -m cluster_ci \
	  tests/cluster

bench: $(STAMP)
	@$(PY) -m pip install -q matplotlib >/dev/null 2>&1 || \
	  echo "matplotlib could not be installed: bench/results gets tables, no plot"
	$(PY) bench/check_speed.py

bench-run: $(STAMP)
	$(PY) bench/run_speed.py

bench-migrate: $(STAMP)
	$(PY) bench/migrate_speed.py

bench-fleet: $(STAMP)
	$(PY) bench/fleet_share.py

bench-cluster: $(STAMP)
	$(PY) bench/cluster_speed.py

bench-recursion: $(STAMP)
	$(PY) bench/recursion.py

bench-tables: $(STAMP)
	$(PY) bench/tables.py

# The docs site into site/ (strict: a broken link fails); make test builds it too (tests/test_docs.py).
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

docs-serve: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs serve

# check --against and fleet check --against on 200 generated job files (Spark; a broker at
# $$KAFKA_BOOTSTRAP, 127.0.0.1:19092 by default): bench/results/import.md
bench-import: $(STAMP)
	$(PY) bench/import_speed.py

bench-sink: $(STAMP)
	$(PY) bench/sink_speed.py

bench-jvm: $(STAMP)
	$(PY) bench/jvm_start.py

# theseus prove over the fixtures' upgrade pairs (issue 28): bench/results/truth.{md,jsonl}
truth: $(STAMP)
	@KAFKA_BOOTSTRAP=$${KAFKA_BOOTSTRAP:-$$(bash scripts/kafka.sh start | \
	  sed -n 's/^KAFKA_BOOTSTRAP=//p' | tail -1)} $(PY) bench/truth.py

# the gated source and sink on Avro topics against Spark's connector with from_avro/to_avro
# (a broker and the registry: started unless KAFKA_BOOTSTRAP, SCHEMA_REGISTRY_URL): avro.md
bench-avro: $(STAMP)
	$(PY) bench/avro_speed.py

lint: $(STAMP)
	$(VENV)/bin/ruff check compat gates migrate tests bench scripts

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
