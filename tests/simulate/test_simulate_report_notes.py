"""The report states the assumptions it rests on and the CPU time it took."""

from __future__ import annotations

import json

from test_simulate_cli import _write_traces

from market_pipeline.cli import main


def test_report_carries_model_notes_and_cpu_seconds(tmp_path, capsys):
    pods, nodes, load = _write_traces(tmp_path)
    out = tmp_path / "r.json"
    html = tmp_path / "r.html"
    code = main(
        [
            "simulate",
            "--pods",
            str(pods),
            "--nodes",
            str(nodes),
            "--load",
            str(load),
            "--days",
            "0.5",
            "--load-start-day",
            "1",
            "--strategies",
            "static,stackelberg",
            "--placement",
            "none",
            "--guaranteed-cap",
            "1.04",
            "--elastic-patience-hours",
            "6",
            "--avoidable-cost-share",
            "0.5",
            "--workers",
            "1",
            "--seed",
            "3",
            "--json",
            str(out),
            "--html",
            str(html),
            "--no-progress",
        ]
    )
    assert code == 0
    capsys.readouterr()
    report = json.loads(out.read_text())
    assert report["assumptions"]["guaranteed_cap"] == 1.04
    assert report["assumptions"]["elastic_patience_hours"] == 6
    assert report["assumptions"]["avoidable_cost_share"] == 0.5
    notes = " ".join(report["model_notes"])
    assert "1.04 x list" in notes and "6 h" in notes and "0.5 x the unit cost" in notes
    assert report["timing"]["cpu_seconds"] > 0
    assert "elastic_deferred" in report["strategies"]["stackelberg"]["extra"]
    assert "Time shifting" in html.read_text()
