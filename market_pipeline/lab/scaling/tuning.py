"""Choose the scaling defaults on held-out time, not on the traces they are judged on.

Procedure (`market-pipeline scaling-tune`; reproducible, no hand-picked constant):

1. Data: the four Helios "Earth" virtual clusters (vc6YE, vcLJZ, vchbv, vcvlY; 31 days a
   minute each). Demand = running + pending GPUs, as in `scaling-eval`.
2. Split in time: the *tuning* window is days 1-15 (minutes [0, 21600)) of every file, the
   *held-out* window days 16-31 (minutes [21600, end)). Each window is replayed as a load of
   its own, starting at the trace's `total_gpu_num` at its first minute, with an empty
   scaler memory; the causal forecaster sees the whole past (it never sees the future, so
   days 1-15 may warm it for the held-out window: that is history, not tuning).
3. Grid (`GRID`): control tick, headroom, the scale-up persistence (how long a shortfall
   a bounded price absorbs is priced rather than scaled), hysteresis, the cool-down after
   a scale-up, the keep band and smallest scale-down batch, and the window whose peak the
   warm pool stays ready to return to. Everything else stays at the configuration's values.
4. Score every combination on the tuning window of all four files against the
   cluster-autoscaler baseline replayed on the same window. A combination is *feasible*
   when, on every file, idle GPU-hours <= 0.7 x the baseline's, unserved (pending incl.
   priced-out) GPU-minutes <= the baseline's, no certificate violation and no more
   actions per day than the baseline. Among feasible ones take the least worst-file idle
   ratio (then fewer actions, then a 5-minute tick: it is the shipped schedule); with none
   feasible, the fewest missed (file, target) pairs, then the least summed relative excess.
5. Report the chosen combination on the held-out window and on the full month. It is
   shipped in `defaults/market.toml` when, on the held-out window, it has no certificate
   violation and leaves less demand unserved than the defaults it replaces; the targets it
   still misses are reported, not hidden (the issue note quotes them).

`pending_gpu_minutes` counts demand the policy's price turned away (see `replay`).
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from market_pipeline.cli.support import input_error
from market_pipeline.lab.scaling.replay import (
    DemandLoad,
    ReplaySettings,
    forecast_series,
    replay_baseline,
    replay_policy,
)
from market_pipeline.lab.scaling.replay_options import add_replay_options, build_settings

HELIOS_FILES = ("vc6YE", "vcLJZ", "vchbv", "vcvlY")
SPLIT_MINUTE = 15 * 1440  # days 1-15 tune, days 16-31 held out
# A first, wider grid (tick 3/5, headroom 0/0.05/0.10, persistence 0/15/60, hysteresis
# 15/30, cool-down 5/10: 72 combinations) found headroom 0 and 0.05 equal (the 5% drift
# margin already adds more) and cool-down 5 and 10 equal; its five best all had persistence
# 0 and hysteresis 30 and none was feasible. A second (persistence 0/5/15, hysteresis
# 30/60) again chose persistence 0, and with scale-down waves, the warm reserve and
# interval-covering resumes in the policy, persistence 5 never ranked in the top five and
# hysteresis 60 ranked below 15 and 30, so they are dropped. This grid adds the scale-down shape (keep band,
# smallest batch) and the warm reserve's window, and is the one reported.
# When the certificate's 5% share-of-capacity margin became a 0.25-GPU floor and the 5%
# moved into the capacity headroom (the larger of it and the forecast quantile, not their
# sum), a rerun chose headroom 0, hysteresis 15, keep band 0.30 and batch 5% (1 miss on
# days 1-15), but it left more demand unserved on days 16-31 than the values it would
# replace (7,045 against 5,847 GPU-minutes), so step 5 kept them. Rerun after failed
# drains cooled only their node and removals refilled the warm pool: headroom 0, hysteresis
# 30, keep band 0.30, batch 5% (1 miss on days 1-15, 5 on days 16-31, 4 over the month);
# days 16-31 unserved 7,137 against the defaults' 6,072 GPU-minutes, so again not shipped.
# Rerun when the keep band became at least one typical demand step, with its cap
# (`keep_band_max_fraction` 0.3/0.4/0.5) added to the grid (648 combinations, 1,631 s with
# --jobs 2): headroom 0, hysteresis 15, keep band 0.05 with cap 0.4 (0.5 ties), batch 12%
# (1 miss on days 1-15: vchbv idle 0.741; 4 on days 16-31; 3 over the month). Days 16-31
# unserved 8,731 against the defaults' 5,582 GPU-minutes: not shipped; the cap of 0.4 is.
# Rerun after the one-tick wait on anticipatory shortfalls and the dead band (1,417 s with
# --jobs 2): no combination meets every check on days 1-15; it chose headroom 0, hysteresis
# 15, keep band 0.05 with cap 0.4, batch 12% (1 miss on days 1-15: vchbv idle 0.727; 5 on
# days 16-31; 3 over the month: vc6YE unserved 5,214 against 4,243 and actions, vchbv
# actions). The shipped defaults miss 1, 4 and 0: they stay, with its hysteresis of 15.
# The tick is the whole control loop's cadence (billing quotes, budget guards and drain
# limits read it too), not a scaling knob: it stays at the shipped 5 minutes. (With a
# 3-minute tick the same choice came out with slightly less unserved demand and more actions.)
GRID: dict[str, tuple[float, ...]] = {
    "tick_minutes": (5,),
    "headroom_fraction": (0.0, 0.05, 0.10),
    "scale_up_persistence_minutes": (0.0,),
    "hysteresis_minutes": (15.0, 30.0),
    "scale_up_cooldown_minutes": (5.0,),
    "keep_band_fraction": (0.05, 0.15, 0.30),
    "keep_band_max_fraction": (0.3, 0.4, 0.5),
    "warm_reserve_window_hours": (12.0, 168.0),
    "min_scale_down_nodes": (1, 2, 3),
    "min_scale_down_fraction": (0.05, 0.12),
}


@dataclass(frozen=True)
class Trial:
    """One replay job: a file's window under one combination (None: the baseline)."""

    file: str
    window: str
    combo: tuple[tuple[str, float], ...] | None
    tick: int


# `scaling-tune --grid fleet-reserve`: the warm reserve's floor alone, the rest at the config's
# values (issue 40: a first 64-GPU job on Helios vcMod after a week below 25 GPUs)
FLEET_RESERVE_GRID: dict[str, tuple[float, ...]] = {
    "tick_minutes": (5,),
    "warm_reserve_fleet_fraction": (0.0, 0.5, 0.75, 1.0),
}


def combos(grid: dict[str, tuple[float, ...]] = GRID) -> list[tuple[tuple[str, float], ...]]:
    keys = sorted(grid)
    return [tuple(zip(keys, values)) for values in itertools.product(*(grid[k] for k in keys))]


def apply_combo(settings: ReplaySettings, combo: tuple[tuple[str, float], ...]) -> ReplaySettings:
    values = dict(combo)
    tick = int(values.pop("tick_minutes", settings.tick_minutes))
    scaling = replace(settings.scaling, interval_minutes=float(tick), **values)
    return replace(settings, scaling=scaling, tick_minutes=tick, forecast_horizon_minutes=tick)


def windows(size: int, split: int = SPLIT_MINUTE) -> dict[str, tuple[int, int]]:
    if not 0 < split < size:
        raise ValueError(f"split minute {split} must lie inside the trace (1..{size - 1})")
    return {"tune": (0, split), "held_out": (split, size), "full": (0, size)}


def compare(policy: dict[str, Any], baseline: dict[str, Any]) -> dict[str, Any]:
    """The issue's targets for one file, with the ratios they are read from."""
    idle_ratio = policy["idle_gpu_hours"] / max(baseline["idle_gpu_hours"], 1e-9)
    pending_ratio = policy["pending_gpu_minutes"] / max(baseline["pending_gpu_minutes"], 1e-9)
    return {
        "idle_ratio": round(idle_ratio, 4),
        "pending_ratio": round(pending_ratio, 4),
        "met": {
            "idle": idle_ratio <= 0.7,
            "pending": policy["pending_gpu_minutes"] <= baseline["pending_gpu_minutes"],
            "violations": policy["certificate_violations"] == 0,
            "actions": policy["actions_per_day"] <= baseline["actions_per_day"],
        },
        "excess": (
            max(0.0, idle_ratio / 0.7 - 1)
            + max(0.0, pending_ratio - 1)
            + policy["certificate_violations"]
            + max(0.0, policy["actions_per_day"] / max(baseline["actions_per_day"], 1e-9) - 1)
        ),
    }


def rank_key(per_file: list[dict[str, Any]], combo: tuple[tuple[str, float], ...], actions: float) -> tuple:
    """Smaller is better: feasibility, then worst idle ratio (or misses and excess)."""
    missed = sum(not ok for c in per_file for ok in c["met"].values())
    worst_idle = max(c["idle_ratio"] for c in per_file)
    excess = sum(c["excess"] for c in per_file)
    tick_pref = 0 if dict(combo).get("tick_minutes") == 5 else 1
    if missed == 0:
        return (0, 0, worst_idle, actions, tick_pref)
    return (1, missed, excess, worst_idle, tick_pref)


# ---- running the replays ---------------------------------------------------------------
_LOADS: dict[str, DemandLoad] = {}
_FORECASTS: dict[tuple[str, int], np.ndarray] = {}
_ARGS: argparse.Namespace | None = None


def _init_worker(loads: dict[str, DemandLoad], args: argparse.Namespace) -> None:
    global _ARGS
    _LOADS.update(loads)
    _ARGS = args


def _settings(load: DemandLoad, tick: int) -> ReplaySettings:
    assert _ARGS is not None
    return build_settings(argparse.Namespace(**{**vars(_ARGS), "tick_minutes": tick}), load.initial_gpus)


def run_trial(trial: Trial) -> tuple[Trial, dict[str, Any], float]:
    full = _LOADS[trial.file]
    first, end = windows(full.demand.size)[trial.window]
    key = (trial.file, trial.tick)
    started = time.process_time()
    if key not in _FORECASTS:  # causal: entry m uses demand[: m + 1] only
        _FORECASTS[key] = forecast_series(full, _settings(full, trial.tick))
    load = full.window(first, end)
    settings = _settings(load, trial.tick)
    print(
        f"  {trial.file} {trial.window} {dict(trial.combo) if trial.combo else 'baseline'}", file=sys.stderr
    )
    forecasts = _FORECASTS[key][first:end]  # the replay reads forecast[m - 1] at minute m
    if trial.combo is None:
        result = replay_baseline(load, settings, forecasts)
    else:
        result = replay_policy(load, apply_combo(settings, trial.combo), forecasts)
    return trial, result, time.process_time() - started


def run_trials(
    trials: list[Trial], loads: dict[str, DemandLoad], args: argparse.Namespace, jobs: int
) -> dict:
    results: dict[Trial, dict[str, Any]] = {}
    cpu = 0.0
    if jobs <= 1:
        _init_worker(loads, args)
        outcomes = map(run_trial, trials)
        for trial, result, spent in outcomes:
            results[trial], cpu = result, cpu + spent
        return {"results": results, "cpu_seconds": cpu}
    with ProcessPoolExecutor(jobs, initializer=_init_worker, initargs=(loads, args)) as pool:
        for trial, result, spent in pool.map(run_trial, trials, chunksize=1):
            results[trial], cpu = result, cpu + spent
    return {"results": results, "cpu_seconds": cpu}


def tune(loads: dict[str, DemandLoad], args: argparse.Namespace, grid=GRID, jobs: int = 1) -> dict[str, Any]:
    """Steps 4-5 of the procedure: grid on the tuning window, the choice on the others."""
    grid_combos = combos(grid)
    ticks = sorted({int(dict(c)["tick_minutes"]) for c in grid_combos})
    files = sorted(loads)
    base_trials = [Trial(f, w, None, t) for f in files for w in ("tune", "held_out", "full") for t in ticks]
    tune_trials = [Trial(f, "tune", c, int(dict(c)["tick_minutes"])) for c in grid_combos for f in files]
    first = run_trials(base_trials + tune_trials, loads, args, jobs)
    results = first["results"]
    ranking = []
    for combo in grid_combos:
        tick = int(dict(combo)["tick_minutes"])
        per_file = [
            compare(results[Trial(f, "tune", combo, tick)], results[Trial(f, "tune", None, tick)])
            for f in files
        ]
        actions = sum(results[Trial(f, "tune", combo, tick)]["actions_per_day"] for f in files)
        ranking.append((rank_key(per_file, combo, actions), combo, per_file))
    ranking.sort(key=lambda item: item[0])
    key, chosen, chosen_tune = ranking[0]
    tick = int(dict(chosen)["tick_minutes"])
    second = run_trials(
        [Trial(f, w, chosen, tick) for f in files for w in ("held_out", "full")], loads, args, jobs
    )
    results.update(second["results"])
    report: dict[str, Any] = {
        "split_minute": SPLIT_MINUTE,
        "grid": {k: list(v) for k, v in grid.items()},
        "combinations": len(grid_combos),
        "chosen": dict(chosen),
        "chosen_feasible_on_tune": key[0] == 0,
        "feasible_on_tune": sum(1 for k, _, _ in ranking if k[0] == 0),
        "top5": [{"combo": dict(c), "rank_key": list(k)} for k, c, _ in ranking[:5]],
        "cpu_seconds": round(first["cpu_seconds"] + second["cpu_seconds"], 1),
        "windows": {},
    }
    for window in ("tune", "held_out", "full"):
        report["windows"][window] = {
            f: _row(results[Trial(f, window, chosen, tick)], results[Trial(f, window, None, tick)])
            for f in files
        }
        report["windows"][window]["all_targets_met"] = all(
            all(r["met"].values()) for r in report["windows"][window].values() if isinstance(r, dict)
        )
    return report


def _row(policy: dict[str, Any], baseline: dict[str, Any]) -> dict[str, Any]:
    c = compare(policy, baseline)
    keys = (
        "idle_gpu_hours",
        "pending_gpu_minutes",
        "queued_gpu_minutes",
        "priced_out_gpu_minutes",
        "actions_per_day",
        "certificate_violations",
        "standby_gpu_hours",
    )
    return {
        "policy": {k: policy[k] for k in keys},
        "baseline": {k: baseline[k] for k in keys},
        "idle_ratio": c["idle_ratio"],
        "pending_ratio": c["pending_ratio"],
        "met": c["met"],
    }


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("scaling-tune", help="choose scaling defaults on days 1-15, report days 16-31")
    parser.add_argument(
        "--data-dir", default="../shared/data/helios-earth", help="folder of the Helios vc*.csv files"
    )
    parser.add_argument("--jobs", type=int, default=1, help="worker processes")
    parser.add_argument(
        "--files",
        default=",".join(HELIOS_FILES),
        help="comma-separated vc names in --data-dir (the tuning set)",
    )
    parser.add_argument(
        "--grid", choices=("full", "fleet-reserve"), default="full", help="which grid (default: full)"
    )
    add_replay_options(parser)
    parser.set_defaults(handler=run_tune)


def run_tune(args: argparse.Namespace) -> int:
    from market_pipeline.lab.scaling.load import LoadFileError, load_helios_demand

    started, cpu0 = time.time(), time.process_time()
    try:
        names = [n.strip() for n in args.files.split(",") if n.strip()]
        if not names:
            return input_error("--files: no file named")
        loads = {name: load_helios_demand(Path(args.data_dir) / f"{name}.csv") for name in names}
    except LoadFileError as exc:
        return input_error(exc)
    if args.jobs < 1:
        return input_error("--jobs must be >= 1")
    grid = FLEET_RESERVE_GRID if args.grid == "fleet-reserve" else GRID
    report = tune(loads, args, grid=grid, jobs=args.jobs)
    report["wall_seconds"] = round(time.time() - started, 1)
    report["parent_cpu_seconds"] = round(time.process_time() - cpu0, 1)
    print(json.dumps(report))
    return 0
