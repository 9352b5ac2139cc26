"""`market-pipeline solve` and `market-pipeline bench solver`."""

from __future__ import annotations

import json

import pytest
from market_test_helpers import resource, tenant

from market_pipeline.cli import main


def _instance(tmp_path, resources, tenants):
    path = tmp_path / "instance.json"
    path.write_text(json.dumps({"resources": resources, "tenants": tenants}))
    return str(path)


def test_solve_prints_one_json_object(tmp_path, capsys):
    path = _instance(
        tmp_path,
        [resource("gpu-a", 30.0, 1.0, 0.1, 20.0), resource("gpu-b", None, 0.5, 0.1, 20.0)],
        [tenant(f"t{j}", [4.0 + j, 2.0], [1.0, 2.0], 10.0) for j in range(6)],
    )
    assert main(["solve", "--instance", path, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out["prices"]) == set(out["demand"]) == {"gpu-a", "gpu-b"}
    for key in ("profit", "kkt_residual", "converged", "iterations", "seconds"):
        assert key in out
    assert out["converged"] is True and out["kkt_residual"] <= 1e-6
    assert out["demand"]["gpu-a"] <= 30.0 * (1 + 1e-6)


def test_solve_reports_an_invalid_instance_by_field(tmp_path, capsys):
    path = _instance(tmp_path, [resource("gpu", 1.0)], [tenant("t", [1.0], [1.0], 1.0, "cubic")])
    assert main(["solve", "--instance", path, "--json"]) == 2
    assert "tenants[0]" in capsys.readouterr().err


def test_solve_missing_file(tmp_path, capsys):
    assert main(["solve", "--instance", str(tmp_path / "nope.json")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_bench_solver_with_baseline(capsys):
    assert main(["bench", "solver", "--tenants", "30", "--resources", "4", "--baseline", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    for key in (
        "tenants",
        "resources",
        "seconds",
        "kkt_residual",
        "profit",
        "converged",
        "baseline_seconds",
        "baseline_profit",
    ):
        assert key in out
    assert out["tenants"] == 30 and out["resources"] == 4 and out["converged"] is True
    assert out["profit"] >= out["baseline_profit"] * (1 - 1e-3)


def test_bench_solver_memory_grows_linearly_with_tenants(capsys):
    """The solver's working memory per tenant x resource cell stays flat as tenants grow 4x
    (M = 11: no other test solves that width, so the pooled workspace is this test's)."""
    per_cell, peak_per_cell = [], []
    for tenants in (5000, 20000):  # both above compaction.MIN_ROWS (its buffers join above it)
        assert (
            main(
                ["bench", "solver", "--tenants", str(tenants), "--resources", "11", "--repeat", "1", "--json"]
            )
            == 0
        )
        out = json.loads(capsys.readouterr().out)
        assert out["workspace_bytes"] >= 8 * tenants * 11  # at least one float64 (N, M) array
        per_cell.append(out["workspace_bytes_per_cell"])
        peak_per_cell.append(out["peak_rss_delta_bytes_per_cell"])
    assert per_cell[1] == pytest.approx(per_cell[0], rel=0.25)
    if peak_per_cell[0] is not None:  # Linux: the peak above the pre-solve RSS is linear plus a
        assert 0 < peak_per_cell[1] <= 1.25 * peak_per_cell[0]  # constant (the bounded cold-start grid)


@pytest.mark.parametrize("argv", [["--tenants", "0", "--resources", "2"]])
def test_bench_rejects_bad_sizes(argv, capsys):
    assert main(["bench", "solver", *argv, "--json"]) == 2
