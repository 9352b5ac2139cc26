"""Two drain plans racing one disruption budget.

Two processes plan at once (released together by a barrier), each asked by an operator to drain
a different task of the same pool, whose budget has room for exactly one more disrupted node.
Whatever the interleaving, one drain is admitted and the other refused with the pool budget as
its reason, and the stored decisions spend the budget once: on the embedded DuckDB file and on
the cluster profile (a DuckLake with its control state in PostgreSQL). Each round plays on a pool
of its own, so the rounds are independent races.
"""

from __future__ import annotations

import multiprocessing
from datetime import timedelta
from pathlib import Path

import pytest
from drain_testkit import T0, FakeClock, FakeFleetAdapter, make_task

from market_pipeline.config import load_config
from market_pipeline.disruption.budget import DisruptionReason
from market_pipeline.drain.service import plan_and_record, tick_budget
from market_pipeline.hardware.protocol import NodeInfo, NodeState
from market_pipeline.warehouse import Lake, Warehouse, open_warehouse
from market_pipeline.warehouse.control import ControlStore

ROUNDS = 5
POOL_NODES = 20  # the shipped budget, 10% of the pool: 2 nodes disrupted at once
PLANNERS = ("a", "b")


def _pool(round_: int) -> str:
    return f"race{round_}"


def _fleet() -> FakeFleetAdapter:
    """Per round a pool of 20 nodes: one cordoned with work still on it (disrupting: 1 of the
    budget's 2), and one task per planner on a node of its own."""
    nodes, tasks = [], []
    started = T0 - timedelta(hours=2)  # past the landing cool-down
    for round_ in range(ROUNDS):
        pool = _pool(round_)
        for i in range(POOL_NODES):
            nodes.append(NodeInfo(f"{pool}-n{i}", pool, "A100-80GB", "z1", 8, NodeState.ON, cordoned=i == 0))
        tasks.append(
            make_task(f"{pool}-moving", tenant="t-moving", pool=pool, node=f"{pool}-n0", started_at=started)
        )
        for i, planner in enumerate(PLANNERS, start=1):
            tasks.append(
                make_task(
                    f"{pool}-{planner}",
                    tenant=f"t-{planner}{round_}",
                    pool=pool,
                    node=f"{pool}-n{i}",
                    started_at=started,
                )
            )
    return FakeFleetAdapter(FakeClock(T0), [(t, "cooperative") for t in tasks], nodes)


def _open(path: Path, lake: Lake | None, control_url: str | None) -> Warehouse:
    control = ControlStore(control_url) if control_url else None
    return open_warehouse(path, migrate=False, lake=lake, control=control)


def _planner(
    planner: str,
    path: Path,
    lake: Lake | None,
    control_url: str | None,
    start,  # noqa: ANN001 - a Barrier
    out,  # noqa: ANN001 - a Queue
) -> None:
    """Each round: wait for the other planner, then plan with the operator's request to drain
    this planner's task of the round's pool; report what was decided."""
    config, adapter = load_config(), _fleet()
    warehouse = _open(path, lake, control_url)
    warehouse.query("SELECT 1")  # connected (a lake attached) before the start line
    for round_ in range(ROUNDS):
        start.wait(timeout=120)
        decisions, _, _ = plan_and_record(
            warehouse, adapter, config, wall_now=T0, manual_task_ids=[f"{_pool(round_)}-{planner}"]
        )
        out.put((planner, round_, [(d.task.task_id, d.allowed, d.reasons) for d in decisions]))


def _race(path: Path, lake: Lake | None = None, control_url: str | None = None) -> None:
    warehouse = _open(path, lake, control_url)
    warehouse.migrate()
    if warehouse.control is not None:
        warehouse.control.migrate()
    config, adapter = load_config(), _fleet()
    ctx = multiprocessing.get_context("spawn")
    start, out = ctx.Barrier(len(PLANNERS)), ctx.Queue()
    procs = [
        ctx.Process(target=_planner, args=(p, path, lake, control_url, start, out), name=f"planner-{p}")
        for p in PLANNERS
    ]
    for proc in procs:
        proc.start()
    try:
        results = [out.get(timeout=300) for _ in range(ROUNDS * len(PLANNERS))]
    finally:
        for proc in procs:
            proc.join(timeout=60)
            if proc.exitcode is None:
                proc.kill()
    assert [proc.exitcode for proc in procs] == [0, 0]

    decided: dict[int, dict[str, tuple[bool, tuple[str, ...]]]] = {}
    for planner, round_, decisions in results:
        # each planner decides its own task only: the operator's request
        assert [task for task, _, _ in decisions] == [f"{_pool(round_)}-{planner}"], decisions
        (_, allowed, reasons) = decisions[0]
        decided.setdefault(round_, {})[planner] = (allowed, reasons)
    stored = warehouse.query(
        "SELECT pool_id, target, allowed, reasons FROM decisions WHERE kind = 'drain' ORDER BY ALL"
    ).rows()
    admitted_by_round = {r: sorted(p for p, (ok, _) in decided[r].items() if ok) for r in range(ROUNDS)}
    assert all(len(a) == 1 for a in admitted_by_round.values()), (
        f"admitted per round {admitted_by_round}, against a budget with room for one"
    )
    for round_ in range(ROUNDS):
        pool = _pool(round_)
        admitted = admitted_by_round[round_]
        (refused,) = set(PLANNERS) - set(admitted)
        blockers = [r for r in decided[round_][refused][1] if r.startswith("pool_budget:")]
        assert blockers == [
            f"pool_budget: {pool} allows 2 of {POOL_NODES} node(s) disrupted for manual, 2 busy"
        ]
        # stored once each, as decided; the budget spent once: the cordoned node and the admitted one
        rows = [(target, allowed) for p, target, allowed, _ in stored if p == pool]
        assert sorted(rows) == sorted([(f"{pool}-{admitted[0]}", True), (f"{pool}-{refused}", False)]), rows
        budget = tick_budget(warehouse, adapter, config, wall_now=T0).pool(pool)
        assert budget.disrupting == {f"{pool}-n0", f"{pool}-n{PLANNERS.index(admitted[0]) + 1}"}
        assert not budget.allows(DisruptionReason.MANUAL, f"{pool}-n5")


def test_two_plans_on_the_embedded_file_admit_one_drain_of_the_last_budget(tmp_path: Path) -> None:
    _race(tmp_path / "warehouse.duckdb")


@pytest.mark.postgres
@pytest.mark.slow
def test_two_plans_on_the_cluster_profile_admit_one_drain_of_the_last_budget(
    tmp_path: Path, migrated_lake: Lake, control_url: str
) -> None:
    _race(tmp_path / "unused.duckdb", lake=migrated_lake, control_url=control_url)
