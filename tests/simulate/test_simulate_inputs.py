from __future__ import annotations

import numpy as np
import pytest

from market_pipeline.lab.simulate.errors import SimulationInputError
from market_pipeline.lab.simulate.inputs import expected_sm_share, load_helios, load_nodes, load_pods
from market_pipeline.lab.simulate.settings import SimulationSettings
from market_pipeline.lab.simulate.synthetic import synthetic_pods


def _helios(path, running, pending, total):
    rows = ["time,running_gpu_num,pending_gpu_num,total_gpu_num"]
    rows += [f"t{i},{r},{p},{c}" for i, (r, p, c) in enumerate(zip(running, pending, total))]
    path.write_text("\n".join(rows) + "\n")
    return path


def test_simulate_helios_files_are_summed_into_one_ratio(tmp_path):
    a = _helios(tmp_path / "a.csv", [10] * 120, [0] * 120, [20] * 120)
    b = _helios(tmp_path / "b.csv", [30] * 60 + [0] * 60, [10] * 120, [20] * 120)
    load = load_helios([a, b], step_minutes=60)
    np.testing.assert_allclose(load.ratio, [(10 + 40) / 40, (10 + 10) / 40])


def test_simulate_helios_errors_name_the_file(tmp_path):
    a = _helios(tmp_path / "a.csv", [1] * 60, [0] * 60, [2] * 60)
    short = _helios(tmp_path / "short.csv", [1] * 30, [0] * 30, [2] * 30)
    with pytest.raises(SimulationInputError, match="short.csv"):
        load_helios([a, short])
    bad = tmp_path / "bad.csv"
    bad.write_text("time,running_gpu_num\n0,1\n")
    with pytest.raises(SimulationInputError, match="bad.csv"):
        load_helios([bad])
    zero = _helios(tmp_path / "zero.csv", [1] * 60, [0] * 60, [0] * 60)
    with pytest.raises(SimulationInputError, match="total_gpu_num"):
        load_helios([zero])


def test_simulate_trace_readers_turn_errors_into_input_errors(tmp_path):
    nodes = tmp_path / "nodes.csv"
    nodes.write_text("sn,gpu\nn1,8\n")
    with pytest.raises(SimulationInputError, match="nodes.csv"):
        load_nodes(nodes)
    with pytest.raises(SimulationInputError, match="does not exist"):
        load_pods(tmp_path / "none.csv")


def test_simulate_long_zero_demand_is_a_gap(tmp_path):
    running = [5] * 60 + [0] * 420 + [5] * 240
    a = _helios(tmp_path / "a.csv", running, [0] * 720, [10] * 720)
    load = load_helios([a], step_minutes=60)
    assert load.gap_steps == 7
    np.testing.assert_allclose(np.nanmean(load.factor()), 1.0)
    # the refusal names the nearest start without a gap: no whole day serves, so the step
    with pytest.raises(SimulationInputError, match=r"gap at day 0.04 .*--load-start-day 0.333333$"):
        load.window(0, 4)
    np.testing.assert_allclose(load.window(8, 4), 1.0)
    with pytest.raises(SimulationInputError, match=r"no window of 0.5 days in the trace is free of gaps$"):
        load.window(0, 12)
    short = _helios(tmp_path / "b.csv", [5] * 60 + [0] * 120 + [5] * 60, [0] * 240, [10] * 240)
    assert load_helios([short], step_minutes=60).gap_steps == 0  # two idle hours are idleness


def test_simulate_window_must_fit_the_load(tmp_path):
    a = _helios(tmp_path / "a.csv", [1] * 120, [0] * 120, [2] * 120)
    load = load_helios([a], step_minutes=60)
    with pytest.raises(SimulationInputError, match="exceeds"):
        load.window(1, 5)
    with pytest.raises(SimulationInputError, match="tick_minutes"):
        SimulationSettings(tick_minutes=7)


def test_simulate_used_share_follows_the_twin_model():
    pods = synthetic_pods(200, seed=1)
    share = expected_sm_share(pods)
    assert np.all((share > 0) & (share < 1))
    multi = pods.num_gpu > 1
    assert share[multi].min() > share[(pods.qos == "LS") & ~multi].max()  # multi-GPU pods train
