"""Issue 23's tracebacks and silently accepted inputs: each is one line and a non-zero exit."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from hardening_kit import REPO_ROOT, TENANT, clear_refusal, run_cli

from market_pipeline.config import DEFAULT_CONFIG_PATH, load_config

DEFAULTS = DEFAULT_CONFIG_PATH.read_text()
POOL = load_config().pools[0].pool_id
MARKET_FIXTURES = REPO_ROOT / "tests" / "market" / "fixtures"


def _toml(tmp_path: Path, text: str) -> str:
    path = tmp_path / "c.toml"
    path.write_text(text)
    return str(path)


def _instance(tmp_path: Path, fixture: str = "kinked_budget_market.json") -> tuple[str, list[str]]:
    data = json.loads((MARKET_FIXTURES / fixture).read_text())["instance"]
    path = tmp_path / "instance.json"
    path.write_text(json.dumps(data))
    return str(path), [r["name"] for r in data["resources"]]


@pytest.fixture(scope="module")
def empty_warehouse(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from market_pipeline.warehouse import open_warehouse

    path = tmp_path_factory.mktemp("quote") / "w.duckdb"
    open_warehouse(path)
    return path


def assert_refused(code: int, err: str, *words: str) -> None:
    assert clear_refusal(code, err), (code, err)
    for word in words:
        assert word in err, err


def test_hardening_config_files_that_are_not_toml_text(tmp_path: Path) -> None:
    assert_refused(*run_cli("config", "--file", str(tmp_path))[::2], "is a directory")
    binary = tmp_path / "b.toml"
    binary.write_bytes(bytes(range(256)) * 4)
    assert_refused(*run_cli("config", "--file", str(binary))[::2], "not UTF-8 text")
    assert_refused(*run_cli("config", "--file", "/dev/zero")[::2], "not a regular file")


def test_hardening_config_toml_datetime_sim_epoch(tmp_path: Path) -> None:
    text = DEFAULTS.replace("[adapter]\n", "[adapter]\nsim_epoch = 2026-11-01T00:00:00Z\n", 1)
    code, out, err = run_cli("config", "--file", _toml(tmp_path, text))
    assert code == 0, err
    assert json.loads(out)["adapter"]["sim_epoch"].startswith("2026-11-01T00:00:00")


@pytest.mark.parametrize(
    ("pattern", "value", "named"),
    [
        (r"(?m)^nodes = \d+", "nodes = 1e8", "pools.0"),  # refused, if only as nodes > max_nodes
        (r"(?m)^max_nodes = \d+", "max_nodes = 100000000", "pools.0.max_nodes"),
        (r"(?m)^price_max = [0-9.]+", "price_max = inf", "pools.0.price_max"),
        (r"(?m)^temp_min_c = [0-9.]+", "temp_min_c = nan", "telemetry.temp_min_c"),
        (r"(?m)^temp_min_c = [0-9.]+", "temp_min_c = 120.0", "temp_min_c (120) must be below"),
        (r"(?m)^temp_max_c = [0-9.]+", "temp_max_c = 1000.0", "telemetry.temp_max_c"),
    ],
)
def test_hardening_config_numbers_are_finite_and_physical(
    tmp_path: Path, pattern: str, value: str, named: str
) -> None:
    text, n = re.subn(pattern, value, DEFAULTS, count=1)
    assert n == 1, pattern
    assert_refused(*run_cli("config", "--file", _toml(tmp_path, text))[::2], named)


def test_hardening_config_solver_tolerance_inf(tmp_path: Path) -> None:
    text = DEFAULTS.replace("[market]\n", "[market]\nsolver_tolerance = inf\n", 1)
    if "solver_tolerance =" in DEFAULTS:
        text = re.sub(r"(?m)^solver_tolerance = .*", "solver_tolerance = inf", DEFAULTS)
    assert_refused(*run_cli("config", "--file", _toml(tmp_path, text))[::2], "market.solver_tolerance")


def test_hardening_fleet_status_refuses_a_huge_fleet(tmp_path: Path) -> None:
    text = re.sub(r"(?m)^max_nodes = \d+", "max_nodes = 100000000", DEFAULTS, count=1)
    text = re.sub(r"(?m)^nodes = \d+", "nodes = 100000000", text, count=1)
    code, _, err = run_cli("fleet", "status", "--config", _toml(tmp_path, text))
    assert code == 2 and "pools.0.nodes" in err and "Traceback" not in err


def test_hardening_solve_bad_files_and_arguments(tmp_path: Path) -> None:
    binary = tmp_path / "b.json"
    binary.write_bytes(bytes(range(256)))
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    assert_refused(*run_cli("solve", "--instance", str(binary))[::2], "not UTF-8")
    assert_refused(*run_cli("solve", "--instance", str(deep))[::2], "nested too deeply")
    assert_refused(*run_cli("solve", "--instance", str(tmp_path))[::2], "directory")
    instance, names = _instance(tmp_path)
    assert_refused(*run_cli("solve", "--instance", instance, "--device", "potato")[::2], "--device")
    assert_refused(*run_cli("solve", "--instance", instance, "--tolerance", "nan")[::2], "--tolerance")
    for value in ("abc", float("nan"), float("inf"), -1.0, True):
        prices = json.dumps(dict.fromkeys(names, value))
        assert_refused(
            *run_cli("solve", "--instance", instance, "--last-prices", prices)[::2], "--last-prices"
        )


def test_hardening_solve_refuses_instances_too_large_to_solve(tmp_path: Path) -> None:
    item = {"name": "r", "capacity": 1, "unit_cost": 1, "price_min": 1, "price_max": 2}
    big = {
        "resources": [{**item, "name": f"r{i}"} for i in range(5000)],
        "tenants": [{"id": "t", "weight": [1] * 5000, "saturation": 1, "budget": 1}],
    }
    path = tmp_path / "big.json"
    path.write_text(json.dumps(big))
    assert_refused(*run_cli("solve", "--instance", str(path))[::2], "5000 resources")


def test_hardening_solve_json_fallback_exits_non_zero_with_the_status(tmp_path: Path) -> None:
    instance, _ = _instance(tmp_path)
    code, out, _ = run_cli("solve", "--instance", instance, "--json", "--tolerance", "1e-15")
    report = json.loads(out)  # strict JSON: no NaN
    assert report["status"] == "fallback" and code == 1


def test_hardening_simulate_arguments_checked_before_the_run(tmp_path: Path) -> None:
    common = ("simulate", "--pods", "p.csv", "--nodes", "n.csv", "--no-progress")
    out = str(tmp_path / "r.json")
    assert_refused(*run_cli(*common, "--placement", "nope", "--json", out)[::2], "--placement")
    assert_refused(*run_cli(*common, "--workers", "0", "--json", out)[::2], "--workers")
    assert_refused(*run_cli(*common, "--json", "/proc/none/r.json")[::2], "cannot be written")
    assert_refused(*run_cli(*common, "--json", str(tmp_path))[::2], "is a directory")
    assert not Path(out).exists()


@pytest.mark.parametrize(
    ("flag", "value", "named"),
    [
        ("--start", "9999-12-31T23:00:00Z", "outside the years"),
        ("--gpus", "1e9", "--gpus must be in"),
        ("--gpus", "inf", "argument --gpus: must be a finite number"),
        ("--hours", "nan", "argument --hours: must be a finite number"),
    ],
)
def test_hardening_quote_bounds(empty_warehouse: Path, flag: str, value: str, named: str) -> None:
    args = {"--gpus": "2", "--hours": "1", flag: value}
    argv = [x for k, v in args.items() for x in (k, v)]
    # a warehouse with no price history (a named warehouse that is not there is refused first)
    code, _, err = run_cli(
        "quote", "--tenant", TENANT, "--pool", POOL, *argv, "--warehouse", str(empty_warehouse)
    )
    assert_refused(code, err, named)
