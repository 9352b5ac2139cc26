from __future__ import annotations

import json

import dagster as dg
from simulate_testkit import inputs, run

from assets.simulation.assets import simulation_assets, simulation_report
from market_pipeline.lab.simulate.report import build_report
from market_pipeline.lab.simulate.saturation import compare_placement, experiment_from_tables


def _report(tmp_path):
    scenario = inputs(ratio=0.5, days=0.25, strategies=("static", "stackelberg"))
    results = {name: run(scenario, name) for name in scenario.settings.strategies}
    placement = compare_placement(experiment_from_tables(scenario.nodes, scenario.pods), ("best_fit",))
    report = build_report(scenario, results, placement, {"total_seconds": 1.0}, {"pods": "synthetic"})
    path = tmp_path / "latest.json"
    path.write_text(json.dumps(report))
    return path, report


def test_simulate_asset_shows_the_published_report(tmp_path):
    path, report = _report(tmp_path)
    result = dg.materialize(
        simulation_assets,
        run_config={"ops": {"simulation_report": {"config": {"report_path": str(path)}}}},
    )
    assert result.success
    metadata = result.asset_materializations_for_node("simulation_report")[0].metadata
    table = metadata["strategies"].value
    assert "| static |" in table and "| stackelberg |" in table
    assert f"{report['strategies']['static']['revenue']:,.0f}" in table
    assert metadata["source"].value == str(path)
    assert metadata["summary_plot"].value.startswith("![summary](data:image/png;base64,")
    assert "best_fit" in metadata["placement"].value
    assumptions = metadata["assumptions"].value
    assert report["model_notes"] and all(f"- {note}" in assumptions for note in report["model_notes"])


def test_simulate_asset_runs_a_small_simulation_without_a_report(tmp_path, monkeypatch):
    monkeypatch.setenv("MARKET_PIPELINE_HOME", str(tmp_path))
    result = dg.materialize(
        [simulation_report],
        run_config={"ops": {"simulation_report": {"config": {"fallback_days": 0.25}}}},
    )
    assert result.success
    metadata = result.asset_materializations_for_node("simulation_report")[0].metadata
    assert metadata["source"].value.startswith("small simulation")
    assert metadata["strategy_count"].value == 3
