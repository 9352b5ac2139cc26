"""A real dagster-celery worker killed with SIGKILL in the middle of a run's step: the broker
(RabbitMQ on 127.0.0.1:5672) hands the step to the other worker, the run resumes there and
succeeds, and every decision of the batch is kept by the fleet once and has one outcome.

The workers, the run's coordinator and the step are separate processes of the cluster
profile's kind (`dagster-celery worker start -A dagster_celery.app -y <yaml>`, the executor
config of `OrchestrationConfig.celery_executor_config`); the queue is the test's own, Dagster's
storage a SQLite home under tmp_path, the control state a fresh PostgreSQL database."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from market_pipeline.config.model import OrchestrationConfig
from market_pipeline.warehouse import open_warehouse
from market_pipeline.warehouse.control import ControlStore
from market_pipeline.warehouse.decisions import DecisionKind, DecisionRow, decisions_frame

pytestmark = [pytest.mark.postgres, pytest.mark.slow]
REPO = Path(__file__).resolve().parents[2]
JOB = Path(__file__).with_name("celery_batch_job.py")
BROKER = "pyamqp://guest@127.0.0.1:5672//"
DECISIONS = [f"s{i:02d}" for i in range(50)]
NOW = datetime(2026, 12, 4, 12, tzinfo=UTC)  # the tick of celery_batch_job.py


def _wait_for(what: str, done: Callable[[], bool], within_s: float, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + within_s
    while not done():
        assert proc.poll() is None, f"exited ({proc.returncode}) while waiting for {what}"
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {within_s:.0f} s waiting for {what}")
        time.sleep(0.05)


def _log(path: Path) -> list[tuple[int, str, str]]:
    if not path.exists():
        return []
    return [
        (int(pid), what, decision)
        for pid, what, decision in (line.split() for line in path.read_text().splitlines())
    ]


@pytest.fixture()
def rabbitmq_queue() -> Iterator[str]:
    """A queue of the test's own on the RabbitMQ at 127.0.0.1:5672, deleted afterwards."""
    with socket.socket() as probe:
        if probe.connect_ex(("127.0.0.1", 5672)) != 0:
            pytest.skip("RabbitMQ is not running on 127.0.0.1:5672")
    name = f"mp_test_{uuid.uuid4().hex[:12]}"
    yield name
    from kombu import Connection, Queue

    with Connection(BROKER, connect_timeout=5) as connection:
        Queue(name, channel=connection.default_channel).delete()


def test_a_worker_killed_mid_step_hands_the_step_to_the_other_and_the_run_resumes(
    control_url: str, rabbitmq_queue: str, tmp_path: Path
) -> None:
    control = ControlStore(control_url)
    warehouse = open_warehouse(tmp_path / "w.duckdb", control=control)
    rows = [
        DecisionRow(
            d, DecisionKind.SCALE, "power_on", NOW, allowed=True, shadow=False, pool_id="p", target=f"n{d}"
        )
        for d in DECISIONS
    ]
    warehouse.append("decisions", decisions_frame(rows))
    del warehouse  # the file is the step's while the run goes on
    home = tmp_path / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    import dagster as dg

    with dg.DagsterInstance.from_config(str(home)) as instance:  # its SQLite made once, not by each worker
        instance.get_runs(limit=1)
        instance.all_instigator_state()
    log = tmp_path / "actions.log"
    yaml = tmp_path / "celery.yaml"  # what `make cluster-up` writes: JSON is YAML
    yaml.write_text(
        json.dumps(
            {"execution": {"config": OrchestrationConfig(celery_broker=BROKER).celery_executor_config()}}
        )
    )
    env = {
        **os.environ,
        "DAGSTER_HOME": str(home),
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",  # `celery`
        "PYTHONPATH": str(REPO),
        "MP_TEST_CELERY_BROKER": BROKER,
        "MP_TEST_CELERY_QUEUE": rabbitmq_queue,
        "MP_TEST_CONTROL_URL": control_url,
        "MP_TEST_WAREHOUSE": str(tmp_path / "w.duckdb"),
        "MP_TEST_LOG": str(log),
    }
    dagster_celery = str(Path(sys.executable).with_name("dagster-celery"))
    workers: dict[str, subprocess.Popen] = {}
    coordinator = None
    try:
        for name in ("w1", "w2"):
            out = (tmp_path / f"{name}.log").open("w")
            workers[name] = subprocess.Popen(
                [dagster_celery, "worker", "start", "-A", "dagster_celery.app", "-y", str(yaml),
                 "-n", name, "-q", rabbitmq_queue, "--", "--concurrency", "1"],
                cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
        for name in workers:
            ready = lambda n=name: " ready." in (tmp_path / f"{n}.log").read_text()  # noqa: E731
            _wait_for(f"worker {name} to be ready", ready, 120, workers[name])

        run_log = tmp_path / "run.log"
        coordinator = subprocess.Popen(
            [sys.executable, str(JOB)], cwd=REPO, env=env, stdout=run_log.open("w"), stderr=subprocess.STDOUT
        )
        # Freeze the worker that acts once it has committed a first part of the batch and acted
        # on more it has not committed yet; kill it only if it is not between committing and
        # recording (so what it committed has its outcome): then the step stops mid-way.
        group_of = {os.getpgid(p.pid): name for name, p in workers.items()}
        victim = None
        deadline = time.monotonic() + 120
        while victim is None:
            assert time.monotonic() < deadline, "the step never got mid-way on a worker"
            assert coordinator.poll() is None, run_log.read_text()[-3000:]
            entries = _log(log)
            acted = [e for e in entries if e[1] == "acted"]
            committed = [e for e in entries if e[1] == "committed"]
            if committed and len(acted) > len(committed) + 1:
                group = os.getpgid(acted[-1][0])
                os.killpg(group, signal.SIGSTOP)
                entries = _log(log)
                committed = {d for _pid, what, d in entries if what == "committed"}
                executed = {
                    d for d, held in control.claims(DECISIONS).items() if held["executed_at"] is not None
                }
                acted_ids = {d for _pid, what, d in entries if what == "acted"}
                if committed == executed and acted_ids - committed and len(acted_ids) < len(DECISIONS):
                    os.killpg(group, signal.SIGKILL)
                    victim = group_of[group]
                else:
                    os.killpg(group, signal.SIGCONT)
            time.sleep(0.05)
        workers[victim].wait(30)
        before = _log(log)

        coordinator.wait(150)  # the other worker takes the step over
        output = run_log.read_text()
        assert coordinator.returncode == 0, output[-3000:]
        assert output.strip().splitlines()[-1].endswith(" SUCCESS"), output[-3000:]
    finally:
        for proc in [*workers.values(), *([coordinator] if coordinator else [])]:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL) if proc in workers.values() else proc.kill()
                proc.wait(30)

    entries = _log(log)
    dead = {pid for pid, _what, _d in before}
    after = entries[len(before) :]
    survivor = {pid for pid, _what, _d in after}
    assert survivor and survivor.isdisjoint(dead)  # the rest ran on the other worker
    other = next(name for name in workers if name != victim)
    assert "execute_plan" in (tmp_path / f"{other}.log").read_text()
    kept = [d for _pid, what, d in entries if what == "committed"]
    assert sorted(kept) == DECISIONS  # every action kept by the fleet once: none lost, none twice
    redone = {d for _pid, what, d in after if what == "acted"}
    done_before = {d for _pid, what, d in before if what == "committed"}
    assert redone == set(DECISIONS) - done_before  # resumed: what was committed is not redone
    held = control.claims(DECISIONS)
    assert all(held[d]["outcome"] == "ok: done" for d in DECISIONS)
    assert len({held[d]["claimed_by"] for d in DECISIONS}) == 1  # one run, resumed
    mirrored = open_warehouse(tmp_path / "w.duckdb", migrate=False).query(
        "SELECT count(*) AS n FROM decisions WHERE outcome = 'ok: done'"
    )
    assert mirrored["n"][0] == len(DECISIONS)
