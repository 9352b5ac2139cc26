# The README's commands: `make demo` (a simulated day through the Dagster instance on the
# embedded default), `make ui` (look at it), `make up` / `make down` (the live loop on the wall
# clock, webserver and daemon, schedules and sensors on) and `make test` (the whole suite).
# All create/refresh .venv from .ci/requirements.lock (`make lock` refreshes it from pyproject.toml).
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
DAYS ?= 1

export MARKET_PIPELINE_HOME ?= $(CURDIR)
export DAGSTER_HOME ?= $(CURDIR)/var/dagster_home

# The live loop keeps its own home: its twin follows the wall clock, the demo's lives a week back.
LIVE_HOME := $(CURDIR)/var/live
LIVE_DAGSTER_HOME := $(LIVE_HOME)/dagster_home
LIVE_PID := $(LIVE_HOME)/dagster-dev.pid
LIVE_LOG := $(LIVE_HOME)/dagster-dev.log
PORT ?= 3000

.PHONY: demo test lint lock ui up down install clean postgres-home slurm-up slurm-down serve cluster-up \
	cluster-down mutate mutate-full

# The lock pins every package (the test extra's included), so installs reproduce; the project
# itself goes in editable, without re-resolving its dependencies.
$(VENV)/.installed: pyproject.toml .ci/requirements.lock
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r .ci/requirements.lock
	$(PY) -m pip install -q -e . --no-deps
	touch $@

install: $(VENV)/.installed

$(DAGSTER_HOME)/dagster.yaml: dagster.yaml
	mkdir -p $(DAGSTER_HOME)
	cp dagster.yaml $@

# A local Slurm test cluster under var/slurm (the slurm backend's default slurm.conf).
slurm-up: $(VENV)/.installed
	$(VENV)/bin/market-pipeline cluster up --backend slurm

slurm-down: $(VENV)/.installed
	$(VENV)/bin/market-pipeline cluster down --backend slurm

# Dagster storage in PostgreSQL: DAGSTER_PG_URL=postgresql://... make postgres-home, then
# DAGSTER_HOME=$(CURDIR)/var/dagster_home_pg for dagster commands.
postgres-home:
	mkdir -p var/dagster_home_pg
	cp market_pipeline/defaults/dagster.postgres.yaml var/dagster_home_pg/dagster.yaml

demo: $(VENV)/.installed $(DAGSTER_HOME)/dagster.yaml
	$(PY) -m assets.harness.demo --days $(DAYS)

test: lint
	$(VENV)/bin/pytest

# The house's checks: lint and format, the import layers and cycles, declared dependencies, dead
# code (vulture's whitelist says why each name it keeps stays).
# Every check runs, so one pass lists every finding; any failure fails the target.
LINT_CHECKS := "ruff check ." "ruff format --check ." "lint-imports" "deptry ." "vulture"
lint: $(VENV)/.installed
	@failed=""; for check in $(LINT_CHECKS); do echo "== $$check"; \
		$(VENV)/bin/$$check || failed="$$failed, $$check"; done; \
	if [ -n "$$failed" ]; then echo "lint failed: $${failed#, }"; exit 1; fi

# Mutation testing (mutmut, `[tool.mutmut]` in pyproject.toml, docs/tooling.md): each mutant of
# the scoped modules runs against only the tests that reach its function, one process each,
# niced. `make mutate` is incremental: it runs the mutants not yet run or whose function
# changed, re-runs the survivors (a new test may kill them) and prints the score;
# `make mutate MUTANTS='market_pipeline.tick.promises.*'` runs the uncaught mutants of a chosen set
# (on a fresh machine, with no mutants/ yet, mutmut first generates them and runs the set whole).
# `make mutate-full` starts afresh and fails below 95%: the scheduled CI job (MUTATE=1 bash .ci/run).
MUTANTS ?=
MUTATE_JOBS ?= 2
MUTMUT := nice -n 10 $(VENV)/bin/mutmut
mutate: $(VENV)/.installed
	@mkdir -p var; : > var/mutmut.log; \
	if [ -z "$(MUTANTS)" ]; then $(MUTMUT) run --max-children $(MUTATE_JOBS) >> var/mutmut.log 2>&1 \
		|| { tail -40 var/mutmut.log; exit 1; }; \
	elif [ ! -d mutants ]; then $(MUTMUT) run --max-children $(MUTATE_JOBS) $(MUTANTS) >> var/mutmut.log 2>&1 \
		|| { tail -40 var/mutmut.log; exit 1; }; fi; \
	pending="$$($(PY) .ci/mutation_score.py --pending $(or $(MUTANTS),'*'))"; \
	if [ -n "$$pending" ]; then $(MUTMUT) run --max-children $(MUTATE_JOBS) $$pending >> var/mutmut.log 2>&1 \
		|| { tail -40 var/mutmut.log; exit 1; }; fi
	$(PY) .ci/mutation_score.py

mutate-full: $(VENV)/.installed
	rm -rf mutants && mkdir -p var
	$(MUTMUT) run --max-children $(MUTATE_JOBS) > var/mutmut.log 2>&1 || { tail -40 var/mutmut.log; exit 1; }
	$(PY) .ci/mutation_score.py --min 95

# Refresh the lock after editing pyproject.toml: keeps the pins it can, adds what is new
# (`make lock LOCK_FLAGS=--upgrade` moves every pin to the newest allowed). torch must stay the
# CPU build from /opt/wheels: the check below refuses a lock that pulls CUDA packages.
LOCK_FLAGS ?=
lock: $(VENV)/.installed
	$(VENV)/bin/uv pip compile pyproject.toml --extra test --python-version 3.11 \
		--python-platform x86_64-unknown-linux-gnu --find-links /opt/wheels \
		--custom-compile-command "make lock" -q $(LOCK_FLAGS) -o .ci/requirements.lock
	@if grep -E '^(triton|nvidia-)' .ci/requirements.lock | grep -v '^nvidia-ml-py=='; then \
		echo "error: .ci/requirements.lock pulls CUDA packages; torch must be the CPU wheel"; exit 1; fi
	@grep -q '^torch==.*+cpu$$' .ci/requirements.lock || { echo "error: torch in .ci/requirements.lock is not the +cpu wheel"; exit 1; }

# dagster dev runs from DAGSTER_HOME: started next to the repository's dagster.yaml it would
# warn that this file is not the instance's (DAGSTER_HOME's copy is).
ui: $(VENV)/.installed $(DAGSTER_HOME)/dagster.yaml
	cd $(DAGSTER_HOME) && $(abspath $(VENV))/bin/python -c "$$RUN_DAGSTER" $(abspath $(VENV))/bin/dagster dev -w $(CURDIR)/workspace.yaml -h 127.0.0.1 -p $(PORT)

# Live: webserver + daemon in the background, every schedule and sensor on, the simulated
# twin on the wall clock (its epoch the hour it was first started; each control tick moves it
# to the tick's time). `make down` stops it.
# dagster dev, run from this one-liner: a background job starts with SIGINT ignored and
# dagster dev stops on SIGINT (Ctrl-C), so it restores Python's SIGINT handler for `make down` (a
# KeyboardInterrupt: dagster dev then shuts its webserver, daemon and code server down in turn;
# SIG_DFL would kill it outright and leave them running); and it hides
# the notice that Dagster 1.13 prefers `dg dev` (dagster-dg-cli, not a dependency here).
export RUN_DAGSTER := import runpy, signal, sys, warnings; signal.signal(signal.SIGINT, signal.default_int_handler); warnings.filterwarnings("ignore", message="Function .dev_command. is superseded"); sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name="__main__")

# the slurm backend's cluster: the one `make slurm-up` starts (the live home is var/live)
up: export MP__ADAPTER__SLURM_CONF ?= $(CURDIR)/var/slurm/etc/slurm.conf
up: $(VENV)/.installed
	@if [ -f $(LIVE_PID) ] && kill -0 $$(cat $(LIVE_PID)) 2>/dev/null; then \
		echo "already up (pid $$(cat $(LIVE_PID))): http://127.0.0.1:$(PORT); make down stops it"; exit 0; fi; \
	mkdir -p $(LIVE_DAGSTER_HOME) && cp dagster.yaml $(LIVE_DAGSTER_HOME)/dagster.yaml; \
	if [ ! -f $(LIVE_HOME)/var/fleet_state.json ]; then \
		export MP__ADAPTER__SIM_EPOCH=$$(date -u +%Y-%m-%dT%H:00:00Z); fi; \
	DAGSTER_HOME=$(LIVE_DAGSTER_HOME) $(PY) -m assets.harness.live_control resume || exit 1; \
	cd $(LIVE_DAGSTER_HOME) && MARKET_PIPELINE_HOME=$(LIVE_HOME) DAGSTER_HOME=$(LIVE_DAGSTER_HOME) \
		MARKET_PIPELINE_LIVE=1 setsid nohup $(abspath $(VENV))/bin/python -c "$$RUN_DAGSTER" \
		$(abspath $(VENV))/bin/dagster dev -w $(CURDIR)/workspace.yaml \
		-h 127.0.0.1 -p $(PORT) > $(LIVE_LOG) 2>&1 & echo $$! > $(LIVE_PID); \
	echo "live loop up (pid $$(cat $(LIVE_PID))): http://127.0.0.1:$(PORT), log $(LIVE_LOG); make down stops it"; \
	cd $(CURDIR) && MARKET_PIPELINE_HOME=$(LIVE_HOME) setsid nohup $(VENV)/bin/market-pipeline serve \
		--port $(SERVE_PORT) > $(LIVE_HOME)/serve.log 2>&1 & echo $$! > $(LIVE_HOME)/serve.pid; \
	echo "service up (pid $$(cat $(LIVE_HOME)/serve.pid)): http://127.0.0.1:$(SERVE_PORT)/console, log $(LIVE_HOME)/serve.log"

# Graceful: the service first (SIGTERM; uvicorn finishes its requests, the webhook worker its
# step), then assets.harness.live_control stops every schedule and sensor, cancels queued runs, lets
# runs in progress finish (DOWN_WAIT seconds, then terminates them: CANCELED, never FAILURE),
# and only then is dagster dev interrupted. The warehouse, the twin and the run history stay;
# `make up` resumes the schedules and sensors it stopped.
DOWN_WAIT ?= 120
down:
	@stop_group() { pid=$$1; name=$$2; sig=$$3; wait=$$4; \
		kill -$$sig $$pid 2>/dev/null; \
		for i in $$(seq $$wait); do pgrep -g $$pid > /dev/null || kill -0 $$pid 2>/dev/null || return 0; sleep 1; done; \
		if pgrep -g $$pid > /dev/null || kill -0 $$pid 2>/dev/null; then \
			echo "$$name did not stop in $$wait s; stopping its process group"; \
			/bin/kill -TERM -- -$$pid 2>/dev/null; sleep 5; /bin/kill -KILL -- -$$pid 2>/dev/null; fi; }; \
	if [ -f $(LIVE_HOME)/serve.pid ]; then stop_group $$(cat $(LIVE_HOME)/serve.pid) service TERM 20; \
		rm -f $(LIVE_HOME)/serve.pid; echo "service stopped"; fi; \
	if [ ! -f $(LIVE_PID) ] || ! kill -0 $$(cat $(LIVE_PID)) 2>/dev/null; then \
		rm -f $(LIVE_PID); echo "not running"; exit 0; fi; \
	DAGSTER_HOME=$(LIVE_DAGSTER_HOME) $(PY) -m assets.harness.live_control down \
		--port $(PORT) --wait $(DOWN_WAIT) || echo "graceful stop incomplete (above); interrupting dagster dev anyway"; \
	stop_group $$(cat $(LIVE_PID)) "dagster dev" INT 60; \
	rm -f $(LIVE_PID); echo "live loop stopped"

# The HTTP service (tenant API, console, /metrics) over the demo's warehouse (make demo first);
# keys: `.venv/bin/market-pipeline tenant-key create --tenant T` (or --operator).
SERVE_PORT ?= 8080
serve: $(VENV)/.installed
	$(VENV)/bin/market-pipeline serve --host 127.0.0.1 --port $(SERVE_PORT)

clean:
	rm -rf var dbt/target dbt/logs

# The cluster profile on one machine (README "Cluster profile"): the PostgreSQL databases
# (Dagster storage, DuckLake catalog, which also holds the control schema and the twin) created, then a webserver, the daemon and 2 Celery workers,
# each its own process (group); `make cluster-down` stops them. Override CLUSTER_PG (admin URL),
# CLUSTER_DB (database name prefix) and CELERY_BROKER (RabbitMQ pyamqp:// or Redis redis://).
CLUSTER_HOME := $(CURDIR)/var/cluster
CLUSTER_PG ?= postgresql://postgres@127.0.0.1:5432
CLUSTER_DB ?= mp_cluster
CELERY_BROKER ?= pyamqp://guest@127.0.0.1:5672//
CLUSTER_PORT ?= 3100
CLUSTER_WORKERS ?= 2
export CLUSTER_ENV := PATH=$(abspath $(VENV))/bin:$(PATH) MARKET_PIPELINE_HOME=$(CLUSTER_HOME) DAGSTER_HOME=$(CLUSTER_HOME)/dagster_home \
	DAGSTER_PG_URL=$(subst postgresql://,postgresql+psycopg2://,$(CLUSTER_PG))/$(CLUSTER_DB)_dagster \
	MP__WAREHOUSE__BACKEND=ducklake MP__WAREHOUSE__DATA_PATH=$(CLUSTER_HOME)/lake/ \
	MP__WAREHOUSE__CATALOG_URL=$(CLUSTER_PG)/$(CLUSTER_DB)_lake \
	MP__ORCHESTRATION__EXECUTOR=celery MP__ORCHESTRATION__CELERY_BROKER=$(CELERY_BROKER) \
	MP__CONTROL__BACKEND=postgres MP__ADAPTER__STATE_STORE=control

cluster-up: $(VENV)/.installed
	@mkdir -p $(CLUSTER_HOME)/dagster_home $(CLUSTER_HOME)/lake
	@cp market_pipeline/defaults/dagster.cluster.yaml $(CLUSTER_HOME)/dagster_home/dagster.yaml
	@env $(CLUSTER_ENV) $(PY) -c "import json, sys; from market_pipeline.config import load_config; \
		o = load_config().orchestration; \
		open(sys.argv[1], 'w').write(json.dumps({'execution': {'config': o.celery_executor_config()}})); \
		open(sys.argv[2], 'w').write(o.celery_queue)" $(CLUSTER_HOME)/celery.yaml $(CLUSTER_HOME)/celery.queue
	@$(PY) -c "import psycopg2, sys; c = psycopg2.connect('$(CLUSTER_PG)/test', connect_timeout=5); \
		c.autocommit = True; cur = c.cursor(); \
		[cur.execute('CREATE DATABASE ' + d) for d in sys.argv[1:] \
		 if not (cur.execute('SELECT 1 FROM pg_database WHERE datname = %s', (d,)) or cur.fetchone())]" \
		$(CLUSTER_DB)_dagster $(CLUSTER_DB)_lake
	@env $(CLUSTER_ENV) $(VENV)/bin/market-pipeline migrate
	@cd $(CLUSTER_HOME)/dagster_home && env $(CLUSTER_ENV) $(abspath $(VENV))/bin/dagster instance concurrency set billing_dbt 1
	@start() { name=$$1; shift; pid=$(CLUSTER_HOME)/$$name.pid; \
		if [ -f $$pid ] && kill -0 $$(cat $$pid) 2>/dev/null; then echo "$$name already up"; return; fi; \
		(cd $(CLUSTER_HOME)/dagster_home && env $(CLUSTER_ENV) setsid nohup "$$@" > $(CLUSTER_HOME)/$$name.log 2>&1 & echo $$! > $$pid); \
		echo "$$name up (pid $$(cat $$pid)), log $(CLUSTER_HOME)/$$name.log"; }; \
	start webserver $(abspath $(VENV))/bin/dagster-webserver -w $(CURDIR)/workspace.yaml -h 127.0.0.1 -p $(CLUSTER_PORT); \
	start daemon $(abspath $(VENV))/bin/dagster-daemon run -w $(CURDIR)/workspace.yaml; \
	for i in $$(seq $(CLUSTER_WORKERS)); do start worker$$i env PYTHONPATH=$(CURDIR) $(abspath $(VENV))/bin/dagster-celery worker start \
		-A dagster_celery.app -y $(CLUSTER_HOME)/celery.yaml -n worker$$i -q $$(cat $(CLUSTER_HOME)/celery.queue); done; \
	echo "cluster profile up: http://127.0.0.1:$(CLUSTER_PORT); make cluster-down stops it"

# Each process group gets SIGTERM, then SIGKILL if it is still there 30 s later.
cluster-down:
	@for pid in $(CLUSTER_HOME)/*.pid; do [ -f $$pid ] || continue; p=$$(cat $$pid); \
		if kill -0 $$p 2>/dev/null; then /bin/kill -TERM -- -$$p; \
			for i in $$(seq 30); do pgrep -g $$p > /dev/null || break; sleep 1; done; \
			pgrep -g $$p > /dev/null && /bin/kill -KILL -- -$$p 2>/dev/null; \
			echo "stopped $$(basename $$pid .pid) (pid $$p)"; fi; \
		rm -f $$pid; done
