# The README's two commands: `make demo` (the control loop on the embedded default) and
# `make test` (the whole suite). Both create/refresh .venv from pyproject.toml.
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
DAYS ?= 1

export MARKET_PIPELINE_HOME ?= $(CURDIR)
export DAGSTER_HOME ?= $(CURDIR)/var/dagster_home

.PHONY: demo test ui install clean

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	touch $@

install: $(VENV)/.installed

$(DAGSTER_HOME)/dagster.yaml:
	mkdir -p $(DAGSTER_HOME)
	printf 'concurrency:\n  pools:\n    default_limit: 1\ntelemetry:\n  enabled: false\n' > $@

demo: $(VENV)/.installed $(DAGSTER_HOME)/dagster.yaml
	$(PY) -m assets.control_loop --days $(DAYS)

test: $(VENV)/.installed
	$(VENV)/bin/pytest

ui: $(VENV)/.installed $(DAGSTER_HOME)/dagster.yaml
	$(VENV)/bin/dagster dev -w workspace.yaml -h 127.0.0.1 -p 3000

clean:
	rm -rf var dbt/target dbt/logs
