"""Writers in separate processes on one DuckLake, with no `warehouse` pool between them: each
commits its own transaction and retries when it loses to the other ("Transaction conflict").
Nothing is lost or written twice, and a decision is claimed by exactly one run."""

from __future__ import annotations

import datetime as dt
import multiprocessing
from pathlib import Path

import polars as pl
import pytest

from market_pipeline.action_batches import claim
from market_pipeline.warehouse import Lake, open_warehouse
from market_pipeline.warehouse.decisions import DecisionKind, DecisionRow, decisions_frame
from market_pipeline.warehouse.writers import record_decisions

pytestmark = pytest.mark.postgres
UTC = dt.timezone.utc
T0 = dt.datetime(2026, 3, 2, 9, tzinfo=UTC)
ROUNDS = 6
ROWS = 50


def _history(pool: str, round_: int) -> pl.DataFrame:
    return pl.DataFrame(
        {
            "pool_id": [pool] * ROWS,
            "ts": [T0 + dt.timedelta(minutes=5 * i) for i in range(ROWS)],
            "running_gpus": [float(round_)] * ROWS,
            "pending_gpus": [0.0] * ROWS,
            "demand": [float(round_)] * ROWS,
            "price": [None] * ROWS,
        },
        schema_overrides={"price": pl.Float64},
    )


def _rewrite_own_pool(lake: Lake, pool: str, start) -> None:  # noqa: ANN001 - a Barrier
    """ROUNDS idempotent rewrites of this pool's rows (delete + insert in one transaction)."""
    store = open_warehouse(Path("unused.duckdb"), migrate=False, lake=lake)
    store.query("SELECT 1")  # attached before the start line
    start.wait(timeout=120)
    for round_ in range(ROUNDS):
        store.replace_where("demand_history", "pool_id = ?", [pool], _history(pool, round_))
        store.append("solve_reports", _solve(f"{pool}-{round_}"))


def _solve(solve_id: str) -> pl.DataFrame:
    return pl.DataFrame(
        {"solve_id": [solve_id], "solved_at": [T0], "status": ["ok"], "converged": [True], "shadow": [True]},
        schema_overrides={"solved_at": pl.Datetime("us", "UTC")},
    ).with_columns(report=pl.lit("{}"))


def _claim_all(lake: Lake, run_id: str, ids: list[str], out: multiprocessing.Queue, start) -> None:  # noqa: ANN001
    store = open_warehouse(Path("unused.duckdb"), migrate=False, lake=lake)
    store.query("SELECT 1")
    start.wait(timeout=120)
    taken: set[str] = set()
    for start in range(0, len(ids), 5):
        taken |= claim(store, ids[start : start + 5], "scale@t", run_id, T0)
    out.put((run_id, sorted(taken)))


def _run_both(target, args_a: tuple, args_b: tuple) -> None:  # noqa: ANN001
    """Both writers in their own process, released at once once both have attached the lake."""
    ctx = multiprocessing.get_context("spawn")
    start = ctx.Barrier(2)
    procs = [ctx.Process(target=target, args=(*args, start)) for args in (args_a, args_b)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(timeout=240)
        assert proc.exitcode == 0, f"writer {proc.name} exited {proc.exitcode}"


def test_two_processes_rewriting_one_table_lose_nothing(migrated_lake: Lake, tmp_path: Path):
    store = open_warehouse(tmp_path / "unused.duckdb", lake=migrated_lake)
    _run_both(_rewrite_own_pool, (migrated_lake, "a"), (migrated_lake, "b"))
    counts = store.query(
        "SELECT pool_id, count(*) AS n, max(demand) AS last FROM demand_history GROUP BY 1 ORDER BY 1"
    ).rows()
    assert counts == [("a", ROWS, ROUNDS - 1.0), ("b", ROWS, ROUNDS - 1.0)]  # the last rewrite, whole
    solves = store.query("SELECT count(*) AS n, count(DISTINCT solve_id) AS d FROM solve_reports").row(0)
    assert solves == (2 * ROUNDS, 2 * ROUNDS)


def test_two_runs_claiming_one_batch_take_each_decision_once(migrated_lake: Lake, tmp_path: Path):
    store = open_warehouse(tmp_path / "unused.duckdb", lake=migrated_lake)
    rows = [
        DecisionRow(f"d{i:03d}", DecisionKind.SCALE, "power_on", T0, True, False, pool_id="p", target=f"n{i}")
        for i in range(30)
    ]
    record_decisions(store, decisions_frame(rows))
    ids = [r.decision_id for r in rows]
    out = multiprocessing.get_context("spawn").Queue()
    _run_both(
        _claim_all, (migrated_lake, "run-a", ids, out), (migrated_lake, "run-b", list(reversed(ids)), out)
    )
    taken = dict(out.get(timeout=10) for _ in range(2))
    assert not set(taken["run-a"]) & set(taken["run-b"]), "a decision was claimed by both runs"
    assert set(taken["run-a"]) | set(taken["run-b"]) == set(ids)
    holders = dict(store.query("SELECT claimed_by, count(*) AS n FROM decisions GROUP BY 1").rows())
    assert holders == {run: len(ids) for run, ids in taken.items() if ids}


def _prices(effective_from: dt.datetime, writer: str) -> pl.DataFrame:
    pools = ["p1", "p2", "p3"]
    return pl.DataFrame(
        {
            "effective_from": [effective_from] * len(pools),
            "pool_id": pools,
            "gpu_model": ["H100"] * len(pools),
            "zone": ["z"] * len(pools),
            "resource_class": ["on_demand"] * len(pools),
            "price_per_gpu_hour": [2.0 if writer == "a" else 3.0] * len(pools),
            "solve_id": [f"solve-{writer}"] * len(pools),
            "source": ["solver"] * len(pools),
        },
        schema_overrides={"effective_from": pl.Datetime("us", "UTC")},
    )


def _publish_ticks(lake: Lake, writer: str, start) -> None:  # noqa: ANN001 - a Barrier
    """Publish the price book of ROUNDS ticks, racing the other writer on each tick's key."""
    from market_pipeline.warehouse.writers import publish_prices

    store = open_warehouse(Path("unused.duckdb"), migrate=False, lake=lake)
    store.query("SELECT 1")
    start.wait(timeout=120)
    for round_ in range(ROUNDS):
        publish_prices(store, _prices(T0 + dt.timedelta(minutes=5 * round_), writer))


def test_two_runs_publishing_one_ticks_prices_leave_one_price_per_key(migrated_lake: Lake, tmp_path: Path):
    store = open_warehouse(tmp_path / "unused.duckdb", lake=migrated_lake)
    _run_both(_publish_ticks, (migrated_lake, "a"), (migrated_lake, "b"))
    per_key = store.query(
        "SELECT effective_from, pool_id, resource_class, count(*) AS n, count(DISTINCT solve_id) AS solves "
        "FROM price_book GROUP BY ALL ORDER BY ALL"
    )
    assert per_key.height == ROUNDS * 3
    assert per_key["n"].to_list() == [1] * per_key.height, per_key


def _warn_drains(lake: Lake, writer: str, start) -> None:  # noqa: ANN001 - a Barrier
    """ROUNDS drains of this writer's own, each requested then warned: a warning adds its row
    to the outbox, racing the other writer's warnings for the next outbox id."""
    from market_pipeline.drain.protocol import DrainState, DrainTransition, Phase
    from market_pipeline.drain.store import WarehouseAuditStore

    store = open_warehouse(Path("unused.duckdb"), migrate=False, lake=lake)
    audit = WarehouseAuditStore(store)
    store.query("SELECT 1")
    start.wait(timeout=120)
    for round_ in range(ROUNDS):
        drain, task = f"{writer}-{round_}", f"task-{writer}-{round_}"
        requested = {"task": {"task_id": task, "tenant_id": "t1"}, "reasons": ["under_used"]}
        audit.append(
            DrainTransition(drain, 0, DrainState.REQUESTED, Phase.ONLY, T0, task, "n1", "t1", requested)
        )
        warned = {"notice_seconds": 30.0}
        audit.append(DrainTransition(drain, 1, DrainState.WARNED, Phase.BEGIN, T0, task, "n1", "t1", warned))


def test_two_workers_warning_at_once_give_each_warning_its_own_outbox_id(migrated_lake: Lake, tmp_path: Path):
    store = open_warehouse(tmp_path / "unused.duckdb", lake=migrated_lake)
    _run_both(_warn_drains, (migrated_lake, "a"), (migrated_lake, "b"))
    outbox = store.query("SELECT outbox_id, drain_id FROM drain_warning_outbox ORDER BY outbox_id")
    drains = sorted(f"{w}-{r}" for w in "ab" for r in range(ROUNDS))
    assert sorted(outbox["drain_id"].to_list()) == drains  # each warning once
    assert outbox["outbox_id"].to_list() == list(range(1, len(drains) + 1))  # no id taken twice
