"""Small synthetic scenarios for the simulator's tests (seconds, not minutes)."""

from __future__ import annotations

import dataclasses

from market_pipeline.config import MarketPipelineConfig, load_config
from market_pipeline.lab.simulate.engine import RunInputs, StrategyRun
from market_pipeline.lab.simulate.metrics import StrategyResult
from market_pipeline.lab.simulate.runner import build_inputs, make_strategy
from market_pipeline.lab.simulate.settings import EconomicAssumptions, SimulationSettings
from market_pipeline.lab.simulate.synthetic import flat_load, synthetic_fleet, synthetic_pods

FLEET = {"A10": (6, 4), "G2": (6, 8)}


def config() -> MarketPipelineConfig:
    return load_config(environ={})


def with_guarantee(run_inputs: RunInputs, **update: object) -> RunInputs:
    """`run_inputs` with `[guardrails.rigid_guarantee]` changed by `update`."""
    cfg = run_inputs.config
    promise = cfg.guardrails.rigid_guarantee.model_copy(update=update)
    guardrails = cfg.guardrails.model_copy(update={"rigid_guarantee": promise})
    return dataclasses.replace(run_inputs, config=cfg.model_copy(update={"guardrails": guardrails}))


def inputs(
    *,
    days: float = 1.0,
    ratio: float = 0.5,
    pods: int = 400,
    seed: int = 0,
    fleet: dict | None = None,
    runtime_s: float = 1800.0,
    economics: EconomicAssumptions | None = None,
    strategies: tuple[str, ...] = ("static", "utilization", "stackelberg"),
    max_gpus: int = 8,
) -> RunInputs:
    settings = SimulationSettings(
        days=days,
        seed=seed,
        strategies=strategies,
        load_start_day=1.0,
        target_utilization=ratio,
        economics=economics or EconomicAssumptions(tenants_per_class=4),
    )
    load = flat_load(int(days) + 3)
    table = synthetic_pods(pods, seed=seed, max_gpus=max_gpus, median_runtime_s=runtime_s)
    return build_inputs(config(), settings, table, synthetic_fleet(fleet or FLEET), load)


def run(run_inputs: RunInputs, strategy: str) -> StrategyResult:
    """One strategy's run; every job it started or left waiting is one that arrived."""
    result = StrategyRun(run_inputs, make_strategy(strategy, run_inputs)).run()
    jobs = result.metrics
    accounted = jobs["jobs_started"] + jobs["jobs_waiting_at_end"]
    assert accounted <= jobs["jobs_arrived"], (
        f"{strategy}: {accounted} jobs started or waiting, {jobs['jobs_arrived']} arrived"
    )
    return result
