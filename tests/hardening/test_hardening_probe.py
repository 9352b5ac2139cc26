"""The CLI probe's inputs (issue 40, item 11), in the suite: each bad input is one `error:` line
on stderr, a non-zero exit that is not the internal-error 70, and no traceback.

The full probe (every numeric and path option of every subcommand, minutes) is
`python .ci/cli_probe.py DIR`, by hand; this runs its hand-picked inputs plus nan, inf, a
negative number and the bad files on a fast selection of options, in-process.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hardening_kit import run_cli
from probe_inputs import QUOTE, make_fixtures, special_inputs

from market_pipeline.cli import INTERNAL_ERROR

# The probe's own inputs that take longer than a refusal (a query child, a replay that runs)
# are covered elsewhere: the bounded sql in tests/core/test_core_sql_bounds.py.
SLOW = {"sql", "tenant-sql"}
FOLDER = "{d}"


def _inputs() -> list[list[str]]:
    inputs = [argv for argv in special_inputs(FOLDER) if argv[0] not in SLOW]
    load = ["scaling-eval", "--load", f"{FOLDER}/load.csv"]
    for option in (
        "--node-gpus",
        "--max-nodes-factor",
        "--cold-delay",
        "--pin-probability",
        "--tick-minutes",
    ):
        for value in ("nan", "inf", "-1"):
            inputs.append([*load, option, value])
    quote = QUOTE
    for bad in (f"{FOLDER}/dir", "/dev/zero", f"{FOLDER}/garbage.bin", f"{FOLDER}/nonexistent.csv"):
        inputs.append([*quote, "--warehouse", bad])
        inputs.append(["config", "--file", bad])
        inputs.append(["solve", "--instance", bad])
        inputs.append(["forecast", "backtest", "--series", bad])
        inputs.append(["demand", "fit", "--history", bad])
        inputs.append(["scaling-eval", "--load", bad])
    for value in ("nan", "-1", "1.5"):
        inputs.append(["demand", "fit", "--history", f"{FOLDER}/history.csv", "--level", value])
        inputs.append(["forecast", "backtest", "--series", f"{FOLDER}/load.csv", "--train-fraction", value])
    return inputs


@pytest.fixture(scope="module")
def probe_dir(tmp_path_factory: pytest.TempPathFactory, shared_data: Path) -> Path:
    folder = tmp_path_factory.mktemp("probe")
    make_fixtures(folder)
    return folder


@pytest.mark.parametrize("argv", _inputs(), ids=lambda argv: " ".join(argv)[:90])
def test_a_bad_input_is_one_clear_line(
    argv: list[str], probe_dir: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("MARKET_PIPELINE_HOME", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    code, _, err = run_cli(*(part.replace(FOLDER, str(probe_dir)) for part in argv))
    lines = [line for line in err.splitlines() if line.strip()]
    assert code not in (0, INTERNAL_ERROR), (code, err)
    assert len(lines) == 1 and lines[0].startswith("error"), err
    assert "Traceback" not in err and "internal error" not in err
    assert not (Path("/tmp") / "x.html").exists()  # cost-report's ../../../tmp/x wrote nothing


def test_the_report_of_a_known_tenant_stays_in_its_folder(
    probe_dir: Path, tmp_path: Path, monkeypatch
) -> None:
    monkeypatch.chdir(tmp_path)
    code, _, err = run_cli(
        "cost-report", "--tenant", "../../../tmp/x", "--warehouse", str(probe_dir / "w.duckdb")
    )
    assert code == 2 and "not a tenant id" in err
    assert not list(tmp_path.rglob("*.html"))


def test_one_payment_under_any_spelling_of_its_reference(probe_dir: Path, tmp_path: Path) -> None:
    warehouse = tmp_path / "w.duckdb"
    warehouse.write_bytes((probe_dir / "w.duckdb").read_bytes())
    for reference in ("r1 ", "R1", "r1", " r1"):
        code, out, err = run_cli(
            "balance",
            "--tenant",
            "acme-research",
            "--top-up",
            "5",
            "--reference",
            reference,
            "--warehouse",
            str(warehouse),
        )
        assert code == 0, err
    assert '"balance": "5' in out
    for amount in ("4", "6"):  # a replay with another amount, smaller or larger, is refused
        code, _, err = run_cli(
            "balance",
            "--tenant",
            "acme-research",
            "--top-up",
            amount,
            "--reference",
            "R1",
            "--warehouse",
            str(warehouse),
        )
        assert code == 2 and "already booked" in err


def test_a_bad_environment_override_is_blamed_on_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MP__MARKET__MAX_PRICE_STEP", "abc")
    code, _, err = run_cli("config")
    assert code == 2 and "MP__MARKET__MAX_PRICE_STEP" in err and "market.toml" not in err


@pytest.mark.parametrize("state", ["dir", "/dev/zero"])
def test_fleet_status_with_a_state_path_that_is_no_file(
    state: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "state" if state == "dir" else Path(state)
    if state == "dir":
        path.mkdir()
    monkeypatch.setenv("MARKET_PIPELINE_HOME", str(tmp_path))
    monkeypatch.setenv("MP__ADAPTER__STATE_PATH", str(path))
    code, _, err = run_cli("fleet", "status")
    assert code == 2 and err.startswith("error:") and len(err.strip().splitlines()) == 1, err
