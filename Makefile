# fleetfit: `make demo` runs the demo, `make test` runs lint, type checks and the whole test suite.
# Each target bootstraps what it needs: a virtual environment in .venv, the package, and for the tests
# Debian's mosquitto, victoria-metrics, prometheus and chromium (installed with apt-get when missing).

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
APT := $(shell [ "$$(id -u)" = 0 ] && echo apt-get || echo sudo apt-get)

.PHONY: demo test lint typecheck pytest faults bench screenshots deps-test clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV) || { $(APT) update && $(APT) install -y python3-venv && $(PYTHON) -m venv $(VENV); }
	$(BIN)/python -m pip install --quiet --upgrade pip

$(VENV)/.runtime: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[demo]'
	touch $@

$(VENV)/.test: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $@ $(VENV)/.runtime

demo: $(VENV)/.runtime  # the console stays up after the run until Ctrl-C
	$(BIN)/fleetfit demo --keep-serving

# Real programs the tests start: Mosquitto (the broker), VictoriaMetrics (the InfluxDB v2 write API's stand-in),
# Chromium (renders the optimizer's page headless), systemd-analyze, openssl, and Slurm's controller, node daemon
# and munge (`fleetfit apply` moves real jobs, tests/test_apply_slurm.py). Only the missing ones are
# installed (one apt-get update), so a developer's installed packages are never upgraded behind their back.
deps-test: $(VENV)/.test
	@missing=""; \
	{ command -v mosquitto >/dev/null || [ -x /usr/sbin/mosquitto ]; } || missing="$$missing mosquitto"; \
	command -v victoria-metrics >/dev/null || missing="$$missing victoria-metrics"; \
	command -v prometheus >/dev/null || missing="$$missing prometheus"; \
	command -v chromium >/dev/null || missing="$$missing chromium"; \
	command -v systemd-analyze >/dev/null || missing="$$missing systemd"; \
	command -v openssl >/dev/null || missing="$$missing openssl"; \
	{ command -v slurmctld >/dev/null || [ -x /usr/sbin/slurmctld ]; } || missing="$$missing slurmctld"; \
	{ command -v slurmd >/dev/null || [ -x /usr/sbin/slurmd ]; } || missing="$$missing slurmd"; \
	{ command -v munged >/dev/null || [ -x /usr/sbin/munged ]; } || missing="$$missing munge"; \
	[ -z "$$missing" ] || { echo "installing:$$missing"; $(APT) update && DEBIAN_FRONTEND=noninteractive \
		$(APT) install -y --no-install-recommends $$missing; }

lint: $(VENV)/.test
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(VENV)/.test
	$(BIN)/mypy

pytest: deps-test
	$(BIN)/pytest

test: lint typecheck pytest

# The console's pictures in docs/ (console.png and the pages a capacity team walks through), retaken from a demo
# run in headless Chromium; the tests take the same pictures without writing them, so a test run leaves the
# checkout as it was.
screenshots: deps-test
	FLEETFIT_SCREENSHOTS=1 $(BIN)/pytest -q tests/test_console_demo.py -k walks

faults: deps-test  # the fault-injection tests at full length (about 6 minutes)
	$(BIN)/pytest -m fault --full-faults -s

# The benchmarks that need no GPU and no long soak, one after the other (several minutes); each prints its
# figures against a baseline measured in the same run. BENCH="e2e simulate_scale" runs others (docs/benchmarks.md).
BENCH ?= console plan classify ingest intake store_lines
bench: deps-test
	@for b in $(BENCH); do echo "== bench/$$b.py"; $(BIN)/python bench/$$b.py || exit 1; done

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache .hypothesis
