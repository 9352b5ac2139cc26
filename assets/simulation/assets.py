"""The latest offline market simulation, shown in the Dagster UI.

Reads the report the CLI published (`market-pipeline simulate ... --publish` writes
`var/simulation/latest.json`), or, when there is none, runs a small simulation on the
configured pools with the built-in workload so the asset always has something to show.
"""

# No `from __future__ import annotations`: Dagster resolves the config class at definition.
import base64
import json
from pathlib import Path

import dagster as dg

from market_pipeline.config import load_config
from market_pipeline.lab.simulate.commands import LATEST_REPORT
from market_pipeline.lab.simulate.report import (
    placement_table_markdown,
    strategy_table_markdown,
    targets_table_markdown,
)


class SimulationReportConfig(dg.Config):
    report_path: str = ""  # default: var/simulation/latest.json under the project home
    config_path: str = ""  # TOML config (default: shipped or MARKET_PIPELINE_CONFIG)
    fallback_days: float = 1.0  # length of the small simulation when no report exists
    seed: int = 0


@dg.asset(group_name="simulation", kinds={"python"})
def simulation_report(
    context: dg.AssetExecutionContext, config: SimulationReportConfig
) -> dg.MaterializeResult:
    """Strategy comparison (static, utilisation-based, Stackelberg + guardrails) and placement
    policies at saturation, from the latest published report or a small fresh simulation."""
    from market_pipeline.lab.simulate.report_html import summary_png  # matplotlib: load when materialising
    from market_pipeline.lab.simulate.small import small_report  # torch and the solver: likewise

    market_config = load_config(config.config_path or None)
    path = Path(config.report_path) if config.report_path else market_config.resolve_path(LATEST_REPORT)
    if path.is_file():
        report = json.loads(path.read_text())
        source = str(path)
    else:
        context.log.info("no published report at %s: running a small simulation", path)
        report = small_report(market_config, days=config.fallback_days, seed=config.seed)
        source = "small simulation (configured pools, built-in workload)"
    image = base64.b64encode(summary_png(report)).decode()
    strategies = report.get("strategies", {})
    return dg.MaterializeResult(
        metadata={
            "source": dg.MetadataValue.text(source),
            "generated_at": dg.MetadataValue.text(str(report.get("generated_at"))),
            "strategies": dg.MetadataValue.md(strategy_table_markdown(report)),
            "targets": dg.MetadataValue.md(targets_table_markdown(report)),
            "placement": dg.MetadataValue.md(
                placement_table_markdown(report) if report.get("placement") else "not run"
            ),
            "summary_plot": dg.MetadataValue.md(f"![summary](data:image/png;base64,{image})"),
            # what the comparison rests on (latent demand, sunk idle cost, caps...): the figures
            # above are only as good as these
            "assumptions": dg.MetadataValue.md(
                "\n".join(f"- {note}" for note in report.get("model_notes", []))
                or "not stated in this report"
            ),
            "strategy_count": len(strategies),
            "simulated_days": float(report.get("settings", {}).get("days", 0.0)),
        }
    )


simulation_assets = [simulation_report]
