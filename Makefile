# Theseus: the two set-up commands are `make demo` and `make test`; both install what they need.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: test demo kafka kafka-stop bench bench-run bench-migrate bench-fleet bench-tables lint clean

$(STAMP): pyproject.toml
	@command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || \
	  { echo "installing chromium (headless browser tests)"; \
	    (apt-get update -qq && apt-get install -y -qq chromium) >/dev/null 2>&1 || \
	    echo "warning: could not install chromium"; }
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev,runtime]'
	touch $(STAMP)

test: $(STAMP)
	$(PY) -m pytest -q

demo: $(STAMP)
	$(PY) scripts/demo.py

kafka:
	@bash scripts/kafka.sh start

kafka-stop:
	@bash scripts/kafka.sh stop

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

bench-tables: $(STAMP)
	$(PY) bench/tables.py

lint: $(STAMP)
	$(VENV)/bin/ruff check compat gates migrate tests bench scripts

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
