"""A small truth grid: the loop learns from its own prices beside a clairvoyant leader."""

from __future__ import annotations

import pytest

from market_pipeline.lab.demand_response.grid_run import run_grid, run_point
from market_pipeline.lab.demand_response.truth import TruthPoint, judged_points, tuning_points
from market_pipeline.lab.demand_response.truth_grid import GridSettings

SMALL = GridSettings(days=1, history_days=3)


@pytest.fixture(scope="module")
def small_grid():
    points = (
        TruthPoint("inelastic e0.3/r0", 0.3, 0.0),
        TruthPoint("elastic e2.5/r0.5", 2.5, 0.5),
        TruthPoint("latent e2/r0.2", 2.0, 0.2, latent_ratio=1.0),
    )
    return run_grid(points, SMALL)


def test_targets_hold_on_a_small_grid(small_grid):
    summary = small_grid["summary"]
    assert summary["promise_breaches"] == 0
    assert summary["revenue_ge_static_everywhere"]
    assert summary["experiment_cost_share_worst"] <= 0.01
    assert summary["regret_worst"] <= 0.08
    assert (
        summary["claims_only_regret_worst"] > summary["regret_worst"]
    )  # claims at 2, truth at 0.3: learning pays


def test_every_point_reports_the_seed_table_and_the_error_over_time(small_grid):
    for row in small_grid["points"]:
        for who in ("loop_vs_static", "clairvoyant_vs_static"):
            assert {"revenue_x", "profit_x", "utilisation", "elastic_cost_x", "rigid_cost_x"} <= set(row[who])
        assert row["clairvoyant"]["profit"] >= row["loop"]["profit"] * 0.99  # the truth is hard to beat
        assert len(row["elasticity_error_over_time"]) == 24 // SMALL.refit_every
        assert sum(row["experiment_ticks"].values()) > 0


def test_the_loop_learns_an_inelastic_elastic_class(small_grid):
    """Claims say 2, truth says 0.3: the fit moves toward the truth and regret shrinks."""
    row = small_grid["points"][0]
    assert row["point"] == "inelastic e0.3/r0"
    assert row["final_fits"]["A100@grid/drainable"]["elasticity"] < 1.5
    assert row["regret_share"] < row["claims_only_regret_share"]


def test_shadow_mode_records_experiments_and_publishes_the_ticks_own_prices():
    point = TruthPoint("e1", 1.0, 0.25)
    shadow = run_point(point, GridSettings(days=1, history_days=3, shadow=True))
    assert sum(shadow["experiment_ticks"].values()) > 0
    assert shadow["experiment_cost_share"] == 0.0 and shadow["promise_breaches"] == 0


def test_judged_points_are_held_out_from_tuning():
    judged = {(p.elastic, p.rigid, p.latent_ratio) for p in judged_points()}
    tuned = {(p.elastic, p.rigid, p.latent_ratio) for p in tuning_points()}
    assert not judged & tuned
    elastic = [p.elastic for p in judged_points()]
    rigid = [p.rigid for p in judged_points()]
    assert min(elastic) == 0.2 and max(elastic) == 3.0 and min(rigid) == 0.0 and max(rigid) == 0.5
    assert any(p.latent_ratio > 0 for p in judged_points())
    assert TruthPoint("x", 2.0, 0.2).elasticity("drainable", 3) > TruthPoint("x", 2.0, 0.2).elasticity(
        "drainable", 15
    )
