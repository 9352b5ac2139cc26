"""Faults on the cluster profile's control state: PostgreSQL restarted in the middle of a
stream of claims, outcomes and drain steps (nothing lost or duplicated), PostgreSQL gone (one
line naming it), and a worker process killed with SIGKILL in the middle of a batch (the retried
run takes its claims over and every decision ends with one outcome).

The restart needs a PostgreSQL of the test's own (it must not restart the shared one): the
fixture makes one with `initdb` on the first free port from 18701 and skips when the server
binaries are absent."""

from __future__ import annotations

import glob
import multiprocessing
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import pytest

from market_pipeline import action_batches as ab
from market_pipeline.warehouse import open_warehouse
from market_pipeline.warehouse.control import ControlError, ControlStore
from market_pipeline.warehouse.decisions import DecisionKind, DecisionOutcome, DecisionRow, decisions_frame

PORTS = range(18701, 18800)  # the first free one (the suite runs tests in parallel)
NOW = datetime(2026, 12, 4, 12, tzinfo=UTC)
pytestmark = pytest.mark.postgres


@dataclass
class PrivatePostgres:
    bin: Path
    data: Path
    user: str | None
    port: int = 0

    @property
    def dsn(self) -> str:
        return f"host=127.0.0.1 port={self.port} user=postgres dbname=postgres"

    def ctl(self, *args: str) -> None:
        command = [str(self.bin / "pg_ctl"), "-D", str(self.data), "-w", "-t", "60", *args]
        if self.user:
            command = ["runuser", "-u", self.user, "--", *command]
        subprocess.run(command, check=True, capture_output=True, timeout=90)


@pytest.fixture()
def private_postgres() -> Iterator[PrivatePostgres]:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb")) or (
        [shutil.which("initdb")] if shutil.which("initdb") else []
    )
    if not found:
        pytest.skip("the PostgreSQL server binaries (initdb, pg_ctl) are not installed")
    bin_dir = Path(found[-1]).parent
    user = None
    if os.geteuid() == 0:  # initdb refuses root: run the server as `postgres`
        try:
            owner = pwd.getpwnam("postgres")
        except KeyError:
            pytest.skip("running as root and there is no postgres user to run a test server as")
        user = "postgres"
    data = Path(tempfile.mkdtemp(prefix="cluster_helper_pg_"))
    if user:
        os.chown(data, owner.pw_uid, owner.pw_gid)
    init = [str(bin_dir / "initdb"), "-D", str(data), "-U", "postgres", "--auth=trust", "-E", "UTF8"]
    subprocess.run(
        ["runuser", "-u", user, "--", *init] if user else init, check=True, capture_output=True, timeout=120
    )
    server = PrivatePostgres(bin_dir, data, user)
    for port in PORTS:
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                continue  # taken
        options = f"-p {port} -k {data} -c listen_addresses=127.0.0.1 -c fsync=off"
        try:
            server.ctl("-o", options, "-l", str(data / "log"), "start")
        except subprocess.CalledProcessError:
            continue  # another test took it meanwhile
        server.port = port
        break
    else:
        shutil.rmtree(data, ignore_errors=True)
        pytest.skip(f"no free port in {PORTS.start}-{PORTS.stop - 1} for a test PostgreSQL")
    try:
        yield server
    finally:
        with_suppress = subprocess.run  # stop even if a test left it stopped
        command = [str(bin_dir / "pg_ctl"), "-D", str(data), "-m", "immediate", "stop"]
        with_suppress(
            ["runuser", "-u", user, "--", *command] if user else command, capture_output=True, timeout=60
        )
        shutil.rmtree(data, ignore_errors=True)


def test_postgres_restarted_mid_stream_loses_and_doubles_nothing(private_postgres: PrivatePostgres) -> None:
    control = ControlStore(private_postgres.dsn, retry_seconds=60)
    control.migrate()
    ids = [f"d{i:03d}" for i in range(120)]
    errors: list[BaseException] = []
    paused, resume = threading.Event(), threading.Event()

    def stream() -> None:
        try:
            for i, decision in enumerate(ids):
                if i == 40:  # mid-way, its connection open: the server restarts under it
                    paused.set()
                    resume.wait(120)
                assert control.claim([decision], "b@t", "run-1", NOW, ["run-1"]) == {decision}
                control.record_outcomes([(decision, f"ok: {i}")], NOW)
                control.append_step(
                    {
                        "drain_id": "dr",
                        "seq": i,
                        "state": "warned",
                        "task_id": "t",
                        "recorded_at": NOW.isoformat(),
                    }
                )
                time.sleep(0.01)
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)

    worker = threading.Thread(target=stream)
    worker.start()
    assert paused.wait(120), errors
    private_postgres.ctl(
        "-m", "fast", "-l", str(private_postgres.data / "log"), "restart"
    )  # the stream is mid-way: its connection breaks
    resume.set()
    worker.join(120)
    assert not worker.is_alive()
    assert not errors, errors
    held = control.claims(ids)
    assert sorted(held) == ids
    assert [held[d]["outcome"] for d in ids] == [f"ok: {i}" for i in range(len(ids))]
    assert [row["seq"] for row in control.drain_steps("dr")] == list(range(len(ids)))


def test_postgres_gone_is_one_line_naming_it(private_postgres: PrivatePostgres) -> None:
    control = ControlStore(private_postgres.dsn, retry_seconds=1)
    control.migrate()
    private_postgres.ctl("-m", "fast", "stop")
    with pytest.raises(ControlError) as caught:
        control.claim(["x"], "b@t", "run-1", NOW, ["run-1"])
    message = str(caught.value)
    assert "\n" not in message
    assert f"cannot reach the control PostgreSQL host=127.0.0.1 port={private_postgres.port}" in message


def _worker(path: str, url: str, acted: str, run_id: str) -> None:
    """A batch run that acts slowly: the test kills it with SIGKILL mid-way."""
    warehouse = open_warehouse(path, migrate=False, control=ControlStore(url))
    rows = ab.batch_rows(warehouse, DecisionKind.SCALE, NOW)

    def act(row: dict) -> ab.ActionResult:
        with open(acted, "a") as handle:
            handle.write(f"{run_id} {row['decision_id']}\n")
        time.sleep(0.15)
        return ab.result_for(row, DecisionOutcome.OK, "done")

    ab.carry_out(
        warehouse, rows, batch_id="scale@t", run_id=run_id, now=NOW,
        run_is_live=lambda _run: False, resumable=True, act=act,
    )  # fmt: skip


def test_worker_killed_mid_batch_then_the_retried_run_resumes(control_url: str, tmp_path: Path) -> None:
    control = ControlStore(control_url)
    warehouse = open_warehouse(tmp_path / "w.duckdb", control=control)
    ids = [f"s{i:02d}" for i in range(20)]
    rows = [
        DecisionRow(
            d, DecisionKind.SCALE, "power_on", NOW, allowed=True, shadow=False, pool_id="p", target=f"n{d}"
        )
        for d in ids
    ]
    warehouse.append("decisions", decisions_frame(rows))
    acted = tmp_path / "acted.log"
    ctx = multiprocessing.get_context("spawn")  # a fresh interpreter: DuckDB's threads do not survive fork
    first = ctx.Process(target=_worker, args=(str(warehouse.path), control_url, str(acted), "run-1"))
    first.start()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and (not acted.exists() or len(acted.read_text().splitlines()) < 5):
        time.sleep(0.02)
    os.kill(first.pid, signal.SIGKILL)  # mid-batch, between two actions, outcomes not yet written
    first.join(10)
    before = [line.split() for line in acted.read_text().splitlines()]
    assert 5 <= len(before) < len(ids)
    assert {control.claims(ids)[d]["claimed_by"] for d in ids} == {"run-1"}  # all claimed, none done

    _worker(str(warehouse.path), control_url, str(acted), "run-2")  # the retried run
    after = [line.split() for line in acted.read_text().splitlines()][len(before) :]
    assert sorted(d for _run, d in after) == ids  # it took every claim of the dead run over
    held = control.claims(ids)
    assert all(held[d]["outcome"] == "ok: done" and held[d]["claimed_by"] == "run-2" for d in ids)
    mirrored = warehouse.query("SELECT count(*) AS n FROM decisions WHERE outcome = 'ok: done'")
    assert mirrored["n"][0] == len(ids)  # the warehouse mirrors each outcome once
    # A third run finds nothing left to do: every decision was carried out before.
    _worker(str(warehouse.path), control_url, str(acted), "run-3")
    assert len(acted.read_text().splitlines()) == len(before) + len(ids)
