"""`market-pipeline demand fit --history CSV --json`: the issue's output, one line on bad input."""

from __future__ import annotations

import json

import polars as pl
import pytest

from market_pipeline.cli import main
from market_pipeline.lab.demand_response.synthetic import HistoryParams, synthetic_history


def _csv(tmp_path, frame: pl.DataFrame):
    path = tmp_path / "history.csv"
    frame.with_columns(pl.col("ts").dt.strftime("%Y-%m-%dT%H:%M:%SZ")).write_csv(path)
    return path


def test_fit_prints_one_object_keyed_by_pool_and_class(tmp_path, capsys):
    frame = pl.concat(
        [
            synthetic_history(HistoryParams(1.5, seed=1)),
            synthetic_history(HistoryParams(0.4, seed=2, pool_id="T4@b", resource_class="guaranteed")),
        ]
    )
    assert main(["demand", "fit", "--history", str(_csv(tmp_path, frame)), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) == {"A100@synthetic/drainable", "T4@b/guaranteed"}
    for key, truth in (("A100@synthetic/drainable", 1.5), ("T4@b/guaranteed", 0.4)):
        row = out[key]
        assert {"elasticity", "elasticity_low", "elasticity_high", "observations"} <= set(row)
        assert row["observations"] == 14 * 24
        assert row["elasticity_low"] < row["elasticity"] < row["elasticity_high"]
        assert abs(row["elasticity"] / truth - 1) < 0.3


@pytest.mark.parametrize(
    "text, message",
    [
        ("ts,pool_id,price,demand\n2026-01-01T00:00:00Z,a,1,2\n", "missing column(s) resource_class"),
        (
            "ts,pool_id,resource_class,price,demand\n2026-01-01T00:00:00Z,a,guaranteed,abc,2\n",
            "price 'abc' is not a finite",
        ),
        ("ts,pool_id,resource_class,price,demand\nyesterday,a,guaranteed,1,2\n", "is not an ISO UTC time"),
        ("ts,pool_id,resource_class,price,demand\n", "no rows"),
        (
            "ts,pool_id,resource_class,price,demand\n2026-01-01T00:00:00Z,a,guaranteed,1,2\n2026-01-01T00:00:00Z,a,guaranteed,1,3\n",
            "two rows for a/guaranteed",
        ),
    ],
)
def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, text, message):
    path = tmp_path / "bad.csv"
    path.write_text(text)
    assert main(["demand", "fit", "--history", str(path), "--json"]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1


def test_missing_file(tmp_path, capsys):
    assert main(["demand", "fit", "--history", str(tmp_path / "none.csv")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_structure_alpha_chooses_whether_the_fit_keeps_the_lag(tmp_path, capsys):
    """`demand fit` tests the lag at the config's rate by default; `--structure-alpha 1` keeps it."""
    path = _csv(tmp_path, synthetic_history(HistoryParams(1.0, seed=0)))
    assert main(["demand", "fit", "--history", str(path), "--lag-hours", "3", "--json"]) == 0
    tested = json.loads(capsys.readouterr().out)["A100@synthetic/drainable"]
    args = ["demand", "fit", "--history", str(path), "--lag-hours", "3", "--structure-alpha", "1", "--json"]
    assert main(args) == 0
    kept = json.loads(capsys.readouterr().out)["A100@synthetic/drainable"]
    assert tested["lag_hours"] == 0 and kept["lag_hours"] == 3
    assert main([*args[:-2], "0", "--json"]) == 2
    err = capsys.readouterr().err.strip()
    assert "--structure-alpha must be in (0, 1]" in err and len(err.splitlines()) == 1
