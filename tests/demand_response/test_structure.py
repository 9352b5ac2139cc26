"""The fit keeps a lag or a daily cycle only where the data have one (issue 40, item 5)."""

from __future__ import annotations

import json

from market_pipeline.cli import main
from market_pipeline.demand_response.history import fit_history
from market_pipeline.lab.demand_response.structure_bench import fit_case
from market_pipeline.lab.demand_response.synthetic import constant_elasticity_panel, structure_case

TRUTH = {"P0": 0.35, "P1": 1.6, "P2": 0.8, "P3": 2.4}


def test_constant_elasticities_get_no_lag_and_no_cycle():
    """The issue's reproduction: four series with constant elasticities and neither a lag nor
    a cycle, the price leaning into a load that moves within the hour. The old fit kept the
    3-hour lag on half of these series and a cycle of amplitude ~0.2 on every one, and its
    intervals held the truth on 5 of 12 (seeds 0-2; on seeds 0 and 2, 2 of 8)."""
    covered = 0
    for seed in (0, 2):
        fits = fit_history(constant_elasticity_panel(seed), lag_hours=3.0, daily_cycle=True)
        for key, fit in fits.items():
            truth = TRUTH[key.split("@")[0]]
            assert fit.lag_hours == 0, (seed, key, fit)
            assert fit.elasticity_cos == 0.0 and fit.elasticity_sin == 0.0, (seed, key, fit)
            assert abs(fit.elasticity - truth) < 0.1 * truth
            covered += fit.elasticity_low <= truth <= fit.elasticity_high
    assert covered >= 5


def test_a_lag_and_a_cycle_that_are_there_are_kept():
    for seed in (2, 4):
        row = fit_case(structure_case(seed, structured=True), structure_alpha=0.1)
        assert row["lag_kept"] and row["cycle_kept"], row


def test_bench_demand_structure_reports_the_tuned_and_the_judged_seeds(capsys):
    assert main(["bench", "demand-structure", "--histories", "2"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["tuning"]["seeds"] == "0..1" and out["judged"]["seeds"] == "10000..10001"
    judged = out["judged"]
    assert judged["histories"] == 2 and judged["with_structure"] == 1
    assert 0 <= judged["coverage_80"] <= 1 and "false_keep_share" in judged and "lag_power" in judged
    assert main(["bench", "demand-structure", "--alpha", "0"]) == 2
    assert "--alpha must be in (0, 1]" in capsys.readouterr().err
