# The README's two commands: `make demo` (the control loop on the embedded default) and
# `make test` (the whole suite). Both create/refresh .venv from pyproject.toml.
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
DAYS ?= 1

export MARKET_PIPELINE_HOME ?= $(CURDIR)
export DAGSTER_HOME ?= $(CURDIR)/var/dagster_home

.PHONY: demo test ui install clean postgres-home

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	touch $@

install: $(VENV)/.installed

$(DAGSTER_HOME)/dagster.yaml: dagster.yaml
	mkdir -p $(DAGSTER_HOME)
	cp dagster.yaml $@

# Dagster storage in PostgreSQL: DAGSTER_PG_URL=postgresql://... make postgres-home, then
# DAGSTER_HOME=$(CURDIR)/var/dagster_home_pg for dagster commands.
postgres-home:
	mkdir -p var/dagster_home_pg
	cp market_pipeline/defaults/dagster.postgres.yaml var/dagster_home_pg/dagster.yaml

demo: $(VENV)/.installed $(DAGSTER_HOME)/dagster.yaml
	$(PY) -m assets.control_loop --days $(DAYS)

test: $(VENV)/.installed
	$(VENV)/bin/pytest

ui: $(VENV)/.installed $(DAGSTER_HOME)/dagster.yaml
	$(VENV)/bin/dagster dev -w workspace.yaml -h 127.0.0.1 -p 3000

clean:
	rm -rf var dbt/target dbt/logs
