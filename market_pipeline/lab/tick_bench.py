"""`bench ticks`: the live loop's market solve, tick after tick, on the default fleet's twin over
many simulated days from several epochs, counting what each solve ended in.

The demo's data moves with the clock (its twin starts a week before today), so each day the
README's first command meets a new instance. This bench meets many: every epoch is another
seed of the twin's workload. Each hour it advances the twin, takes the pool snapshot the
`fleet_inventory` asset takes (`fleet.demand.pool_snapshot`), builds the market the
`equilibrium_prices` asset builds (`tick.pricing.build_market_problem`, the pool inputs of
`tick.live.pool_tick_input`) and runs the one market tick (`tick.run_market_tick`) from the
prices the previous tick published, the global re-solve on the live schedule.

Where the live loop differs, and how the bench stands in:
- the forecast: the loop's forecaster over its demand history; here persistence (the demand
  now is the expected demand, the upper quantile the last hour's highest), what
  `expected_demand_by_pool` falls back to before a forecast exists;
- the demand response: the loop refits elasticities every few hours; here, every
  `refit_hours`, each resource gets an elasticity drawn from `response_range` (seeded), so
  the calibrated path (`tick.response`) is exercised on fits of every size the fit can report;
- scaling and drains do not run: the fleet serves what the twin powers.

A fallback is an outcome the loop survives (it keeps the prices in force); the bench counts
them and lists each with the solver's reason.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
import tempfile
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np

from market_pipeline.config import MarketPipelineConfig
from market_pipeline.fleet.demand import pool_snapshot
from market_pipeline.fleet.twin_adapter import SimulatedAdapter
from market_pipeline.market.resources import DRAINABLE, GUARANTEED
from market_pipeline.tick import Promises, guarantee_reach, run_market_tick
from market_pipeline.tick.live import list_prices, pool_tick_input
from market_pipeline.tick.pricing import build_market_problem, resource_name, solver_settings
from market_pipeline.tick.state import global_resolve_due


@dataclass(frozen=True)
class TickBenchSettings:
    days: float = 30.0
    epochs: tuple[datetime, ...] = ()
    tick_minutes: int = 60  # the demo's tick
    refit_hours: int = 6  # the demo's demand-response refit
    response_range: tuple[float, float] = (0.3, 3.0)
    seed: int = 0
    dump_dir: Path | None = None  # each fallback tick's inputs as JSON, to replay it


def default_epochs(count: int, days: float, end: datetime | None = None) -> tuple[datetime, ...]:
    """`count` epochs a few days apart, the last `days` before `end` (default: now, floored to
    the hour): the days the demo's twin starts from, moved back."""
    end = (end or datetime.now(UTC)).replace(minute=0, second=0, microsecond=0)
    first = end - timedelta(days=days)
    return tuple(first - timedelta(days=3 * k, hours=7 * k) for k in range(count))


def run_tick_bench(config: MarketPipelineConfig, settings: TickBenchSettings) -> dict[str, object]:
    started = time.perf_counter()
    ticks: list[dict[str, object]] = []
    with tempfile.TemporaryDirectory(prefix="bench-ticks-") as tmp:
        for k, epoch in enumerate(settings.epochs):
            ticks += _run_epoch(config, settings, epoch, Path(tmp) / f"twin-{k}.json", settings.seed + k)
    statuses: dict[str, int] = {}
    for t in ticks:
        statuses[str(t["status"])] = statuses.get(str(t["status"]), 0) + 1
    fallbacks = [t for t in ticks if t["status"] == "fallback"]
    seconds = [float(t["seconds"]) for t in ticks]
    return {
        "ticks": len(ticks),
        "epochs": [e.isoformat() for e in settings.epochs],
        "days_per_epoch": settings.days,
        "statuses": dict(sorted(statuses.items())),
        "fallbacks": len(fallbacks),
        "fallback_ticks": [
            {"epoch": t["epoch"], "tick_at": t["tick_at"], "reason": t["reason"], "kkt": t["kkt"]}
            for t in fallbacks
        ],
        "uncertified": sum(1 for t in ticks if not t["certified"]),
        "held_pool_ticks": sum(int(t["held"]) for t in ticks),
        "solve_seconds_median": round(statistics.median(seconds), 4) if seconds else None,
        "solve_seconds_max": round(max(seconds), 4) if seconds else None,
        "iterations_max": max((int(t["iterations"]) for t in ticks), default=0),
        "wall_seconds": round(time.perf_counter() - started, 1),
        "target_fallbacks": 0,
        "within_target": not fallbacks,
    }


def _run_epoch(
    config: MarketPipelineConfig, settings: TickBenchSettings, epoch: datetime, state: Path, seed: int
) -> list[dict[str, object]]:
    adapter = SimulatedAdapter(config, state, epoch=epoch)
    rng = np.random.default_rng(seed)
    promises = Promises.from_config(config)
    solver = solver_settings(config)
    in_force: dict[str, float] = {}
    for pool in config.pools:
        for cls, price in zip((GUARANTEED, DRAINABLE), list_prices(config, pool.pool_id)):
            in_force[resource_name(pool.pool_id, cls)] = price
    history: dict[str, list[float]] = {p.pool_id: [] for p in config.pools}
    response: dict[str, float] = {}
    out = []
    steps = int(settings.days * 24 * 60 / settings.tick_minutes)
    for k in range(1, steps + 1):
        now = epoch + timedelta(minutes=k * settings.tick_minutes)
        adapter.advance(now)
        nodes = adapter.list_nodes()
        snapshot = pool_snapshot(config, nodes, adapter.list_tasks(), adapter.pending_summary(), now)
        serving, fleet_gpus, observed, reach, claim = {}, {}, {}, {}, {}
        for r in snapshot.iter_rows(named=True):
            demand = r["running_gpus"] + r["pending_gpus"]
            serving[r["pool_id"]] = float(r["gpus_on"])
            claim[r["pool_id"]] = (
                max(r["running_gpus"] - r["drainable_running_gpus"], 0.0) + r["guaranteed_pending_gpus"]
            )
            reach[r["pool_id"]] = guarantee_reach(r["drainable_running_gpus"], r["guaranteed_pending_gpus"])
            observed[r["pool_id"]] = (demand, r["pending_gpus"])
            history[r["pool_id"]].append(demand)
        for node in nodes:
            fleet_gpus[node.pool_id] = fleet_gpus.get(node.pool_id, 0.0) + node.gpus
        typical = {p: float(np.mean(h)) for p, h in history.items() if h and np.mean(h) > 0}
        expected = {p: d for p, (d, _) in observed.items()}
        window = max(1, 60 // settings.tick_minutes)
        upper = {p: max(h[-window:]) for p, h in history.items() if h}
        if (k * settings.tick_minutes) % (settings.refit_hours * 60) == 0:
            low, high = settings.response_range
            response = {
                resource_name(p.pool_id, cls): float(rng.uniform(low, high))
                for p in config.pools
                for cls in (GUARANTEED, DRAINABLE)
            }
        inputs = build_market_problem(config, serving, expected, typical, claim, in_force)
        pools = [
            pool_tick_input(
                config,
                p.pool_id,
                in_force,
                serving_gpus=serving.get(p.pool_id, 0.0),
                fleet_gpus=fleet_gpus.get(p.pool_id, 0.0),
                observed=observed.get(p.pool_id),
                forecast_upper=upper.get(p.pool_id),
                has_evidence=p.pool_id in typical,
                reach=reach[p.pool_id],
            )
            for p in config.pools
        ]
        tick = run_market_tick(
            pools,
            inputs.problem,
            promises,
            solver,
            global_resolve=global_resolve_due(
                now, config.market.global_resolve_minutes, settings.tick_minutes
            ),
            switch_threshold=config.market.global_switch_threshold,
            response=response,
        )
        report = tick.report
        if settings.dump_dir is not None and tick.status == "fallback":
            _dump(settings.dump_dir, now, pools, inputs.problem, response, report)
        out.append(
            {
                "epoch": epoch.isoformat(),
                "tick_at": now.isoformat(),
                "status": tick.status,
                "reason": report.fallback_reason if report is not None else None,
                "kkt": float(report.kkt_residual) if report is not None else 0.0,
                "iterations": int(report.iterations) if report is not None else 0,
                "seconds": float(report.seconds) if report is not None else 0.0,
                "certified": all(r.certified for r in tick.pools),
                "held": sum(1 for p in pools if p.hold_reason is not None),
            }
        )
        for r in tick.pools:
            in_force[resource_name(r.pool_id, GUARANTEED)] = r.guaranteed
            in_force[resource_name(r.pool_id, DRAINABLE)] = r.drainable
    return out


def _dump(folder: Path, now: datetime, pools, problem, response, report) -> None:
    """A fallback tick's inputs (`tick.run_market_tick`'s arguments), replayable with
    `replay_dump`."""
    folder.mkdir(parents=True, exist_ok=True)
    body = {
        "tick_at": now.isoformat(),
        "pools": [{**dataclasses.asdict(p), "backlog": dataclasses.asdict(p.backlog)} for p in pools],
        "problem": problem.to_instance_json(),
        "response": response,
        "reason": report.fallback_reason if report is not None else None,
    }
    (folder / f"fallback-{now:%Y%m%dT%H%M}.json").write_text(json.dumps(body))


def replay_dump(path: Path, config: MarketPipelineConfig, global_resolve: bool = True):
    """Run the market tick of a dumped fallback again (the same inputs, today's code)."""
    from market_pipeline.market.problem import MarketProblem
    from market_pipeline.tick import PoolTickInput
    from market_pipeline.tick.certificate import BacklogParams

    body = json.loads(path.read_text())
    pools = [PoolTickInput(**{**p, "backlog": BacklogParams(**p["backlog"])}) for p in body["pools"]]
    return run_market_tick(
        pools,
        MarketProblem.from_instance_json(body["problem"]),
        Promises.from_config(config),
        solver_settings(config),
        global_resolve=global_resolve,
        switch_threshold=config.market.global_switch_threshold,
        response=body["response"],
    )
