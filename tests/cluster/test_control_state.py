"""The cluster profile's control state in PostgreSQL (`warehouse/control.py`), against the real
server on 127.0.0.1:5432: claims and drain steps that two processes race for are taken once,
the twin is shared by adapters of different homes under an advisory lock, and a lock holder
killed with SIGKILL frees its lock."""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
import signal
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from market_pipeline.config import load_config
from market_pipeline.drain.protocol import (
    DrainState,
    DrainTransition,
    DuplicateStepError,
    Phase,
)
from market_pipeline.drain.store import WarehouseAuditStore
from market_pipeline.fleet.twin_adapter import SimulatedAdapter
from market_pipeline.warehouse import open_warehouse
from market_pipeline.warehouse.control import ControlConflict, ControlStore, LockBusy

NOW = datetime(2026, 12, 4, 12, tzinfo=UTC)
pytestmark = pytest.mark.postgres
IDS = [f"d{i:04d}" for i in range(300)]


def _claimer(url: str, run_id: str, start: float, out: multiprocessing.Queue) -> None:
    control = ControlStore(url)
    while time.time() < start:
        time.sleep(0.001)
    taken: set[str] = set()
    for i in range(0, len(IDS), 10):  # many small claims, interleaved with the other process
        taken |= control.claim(
            IDS[i : i + 10][::-1] if run_id == "b" else IDS[i : i + 10], "b@t", run_id, NOW, [run_id]
        )
    out.put((run_id, sorted(taken)))


def test_two_processes_claiming_one_batch_take_each_decision_once(control: ControlStore) -> None:
    ctx = multiprocessing.get_context("fork")
    out: multiprocessing.Queue = ctx.Queue()
    start = time.time() + 0.5
    procs = [ctx.Process(target=_claimer, args=(control.url, run, start, out)) for run in ("a", "b")]
    for proc in procs:
        proc.start()
    got = dict(out.get(timeout=60) for _ in procs)
    for proc in procs:
        proc.join(10)
    assert set(got["a"]).isdisjoint(got["b"])
    assert sorted(got["a"] + got["b"]) == IDS
    held = control.claims(IDS)
    assert all(held[d]["claimed_by"] == ("a" if d in got["a"] else "b") for d in IDS)


def test_a_dead_runs_claim_is_taken_over_only_when_named_and_the_first_outcome_stays(
    control: ControlStore,
) -> None:
    assert control.claim(["x", "y"], "b@t", "dead", NOW, ["dead"]) == {"x", "y"}
    assert control.claim(["x", "y"], "b@t", "next", NOW, ["next"]) == set()  # still held
    assert control.claim(["x", "y"], "b@t", "next", NOW, ["next", "dead"]) == {"x", "y"}
    assert control.record_outcomes([("x", "ok: done")], NOW) == [("x", "ok: done")]
    assert control.record_outcomes([("x", "failed: again"), ("y", "ok: y")], NOW) == [("y", "ok: y")]
    assert control.claim(["x"], "b@t", "third", NOW, ["third", "next"]) == set()  # executed
    assert control.claims(["x"])["x"]["outcome"] == "ok: done"


def test_the_claim_constraints_refuse_a_half_written_row(control: ControlStore) -> None:
    psycopg2 = pytest.importorskip("psycopg2")
    with pytest.raises(psycopg2.errors.CheckViolation):  # noqa: SIM117 - the connection, then the error
        with psycopg2.connect(control.url) as con, con.cursor() as cur:
            cur.execute(
                "INSERT INTO market_control.decision_claims (decision_id, batch_id, executed_at) VALUES ('z', 'b', now())"
            )


def _step(drain: str, seq: int, state: DrainState, at: datetime, **detail: object) -> DrainTransition:
    return DrainTransition(drain, seq, state, Phase.ONLY, at, "task-1", "node-1", "t1", dict(detail))


def test_a_drain_step_is_written_once_and_the_warehouse_mirrors_the_journal(
    control: ControlStore, tmp_path: Path
) -> None:
    warehouse = open_warehouse(tmp_path / "w.duckdb", control=control)
    store = WarehouseAuditStore(warehouse)
    first = _step("dr-1", 0, DrainState.REQUESTED, NOW, task={"task_id": "task-1"})
    store.append(first)
    store.append(first)  # a retry of the same row after a lost commit: nothing new
    with pytest.raises(DuplicateStepError):
        store.append(_step("dr-1", 0, DrainState.REQUESTED, NOW + timedelta(seconds=1)))
    # A crash between the journal's commit and the warehouse's: the next read mirrors it.
    control.append_step(
        {
            "drain_id": "dr-1",
            "seq": 1,
            "state": DrainState.WARNED.value,
            "phase": Phase.ONLY.value,
            "recorded_at": (NOW + timedelta(seconds=2)).isoformat(),
            "task_id": "task-1",
            "node_id": "node-1",
            "tenant_id": "t1",
            "detail": {},
        }
    )
    history = store.load_states("dr-1")
    assert [(t.seq, t.state) for t in history] == [(0, DrainState.REQUESTED), (1, DrainState.WARNED)]
    rows = warehouse.query("SELECT seq, state FROM drain_audit WHERE drain_id = 'dr-1' ORDER BY seq")
    assert rows.rows() == [(0, "requested"), (1, "warned")]
    assert store.open_drain_ids("task-1") == ["dr-1"]


def _append_step(url: str, payload: dict, start: float, out: multiprocessing.Queue) -> None:
    control = ControlStore(url)
    while time.time() < start:
        time.sleep(0.001)
    try:
        out.put(("written" if control.append_step(payload) else "same", os.getpid()))
    except ControlConflict as exc:
        out.put(("refused", str(exc)))


def test_two_processes_writing_one_drain_step_one_is_refused(control: ControlStore) -> None:
    ctx = multiprocessing.get_context("fork")
    out: multiprocessing.Queue = ctx.Queue()
    start = time.time() + 0.5
    base = {"drain_id": "dr-9", "seq": 3, "state": "warned", "task_id": "t", "recorded_at": NOW.isoformat()}
    procs = [
        ctx.Process(target=_append_step, args=(control.url, {**base, "detail": {"by": who}}, start, out))
        for who in ("a", "b")
    ]
    for proc in procs:
        proc.start()
    results = sorted(out.get(timeout=60)[0] for _ in procs)
    for proc in procs:
        proc.join(10)
    assert results == ["refused", "written"]
    assert len(control.drain_steps("dr-9")) == 1


def _hold_lock(url: str, name: str, ready: multiprocessing.Event) -> None:
    with ControlStore(url).lock(name, 5):
        ready.set()
        time.sleep(120)


def test_a_lock_holder_killed_with_sigkill_frees_the_lock(control: ControlStore) -> None:
    ctx = multiprocessing.get_context("fork")
    ready = ctx.Event()
    holder = ctx.Process(target=_hold_lock, args=(control.url, "twin:x", ready))
    holder.start()
    assert ready.wait(30)
    with pytest.raises(LockBusy, match="twin:x is held by PostgreSQL backend"), control.lock("twin:x", 0.2):
        pass
    os.kill(holder.pid, signal.SIGKILL)
    holder.join(10)
    # The server drops the dead session's lock once its backend reads the closed socket, a
    # moment after the kill: the lock is taken within 30 s (LockBusy otherwise).
    with control.lock("twin:x", 30):
        pass


def _shared_config(monkeypatch: pytest.MonkeyPatch, url: str, home: Path):  # noqa: ANN202
    monkeypatch.setenv("MARKET_PIPELINE_HOME", str(home))
    env = {
        "MP__CONTROL__BACKEND": "postgres",
        "MP__CONTROL__URL": url,
        "MP__ADAPTER__STATE_STORE": "control",
    }
    return load_config(environ={**os.environ, **env})


def test_adapters_of_two_homes_share_one_twin_in_postgres(
    control: ControlStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    epoch = datetime(2026, 1, 5, tzinfo=UTC)
    left = SimulatedAdapter(_shared_config(monkeypatch, control.url, tmp_path / "a"), epoch=epoch)
    right = SimulatedAdapter(_shared_config(monkeypatch, control.url, tmp_path / "b"), epoch=epoch)
    left.advance(epoch + timedelta(hours=1))
    assert right.now() == epoch + timedelta(hours=1)
    node = right.list_nodes()[0].node_id
    assert right.cordon(node).ok
    assert next(n for n in left.list_nodes() if n.node_id == node).cordoned
    assert left.read_samples(epoch, epoch + timedelta(hours=1)).equals(
        right.read_samples(epoch, epoch + timedelta(hours=1))
    )
    assert not (tmp_path / "a" / "var").exists() and not (tmp_path / "b" / "var").exists()  # no local file
    state = json.loads(control.blob("var/fleet_state.json", "state.json") or b"{}")
    assert state["generation"] >= 2
    # the Dagster partitions begin where the shared twin's history begins, read from PostgreSQL
    from market_pipeline.fleet.history import _stored_epoch

    assert _stored_epoch(_shared_config(monkeypatch, control.url, tmp_path / "c")) == epoch


def _hold_drain_lease(url: str, ready: multiprocessing.Event) -> None:
    from market_pipeline.drain.lease import ControlTaskLease

    with ControlTaskLease(ControlStore(url), "task-7") as lease:
        lease.record([_step("dr-7", 0, DrainState.REQUESTED, NOW, task={"task_id": "task-7"})])
        ready.set()
        time.sleep(120)


@contextlib.contextmanager
def _lease_once_the_server_drops_the_dead_holder(
    control: ControlStore, task_id: str, within_s: float = 10.0
) -> Iterator[object]:
    """The server frees a killed client's advisory lock when its backend reads the closed socket,
    a moment after the kill, not at the same instant: take the lease within `within_s`."""
    from market_pipeline.drain.lease import ControlTaskLease, DrainBusy

    deadline = time.monotonic() + within_s
    while True:
        lease = ControlTaskLease(control, task_id)
        try:
            lease.__enter__()
        except DrainBusy:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
            continue
        try:
            yield lease
        finally:
            lease.__exit__(None, None, None)
        return


def test_a_drain_lease_in_postgres_refuses_a_second_worker_and_outlives_its_killed_holder(
    control: ControlStore,
) -> None:
    from market_pipeline.drain.lease import ControlTaskLease, DrainBusy

    ctx = multiprocessing.get_context("fork")
    ready = ctx.Event()
    holder = ctx.Process(target=_hold_drain_lease, args=(control.url, ready))
    holder.start()
    assert ready.wait(30)
    with (
        pytest.raises(DrainBusy, match="task task-7 is being drained by another run"),
        ControlTaskLease(control, "task-7"),
    ):
        pass
    os.kill(holder.pid, signal.SIGKILL)  # the worker dies mid-drain
    holder.join(10)
    with _lease_once_the_server_drops_the_dead_holder(control, "task-7") as lease:  # another takes over
        assert lease.open_drain_id() == "dr-7"  # and resumes from the journal the dead one left
        lease.record(
            [_step("dr-7", 0, DrainState.REQUESTED, NOW), _step("dr-7", 1, DrainState.REPORTED, NOW)]
        )
        assert lease.journal() == []  # finished: nothing left to resume
