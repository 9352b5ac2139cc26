"""The CLI probe's inputs: the fixtures it reads and the hand-picked bad inputs. The suite runs a fast selection of them
(`test_hardening_probe.py`); the full probe, every numeric and path option of every
subcommand (minutes, by hand), is `python .ci/cli_probe.py DIR` (docs/cli_probe.md).
"""

from __future__ import annotations

import json
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SHARED = REPO.parent / "shared" / "data"


# a well-formed quote: the probes vary its warehouse
QUOTE = [
    "quote",
    "--tenant",
    "acme-research",
    "--pool",
    "A100-80GB@cn-hangzhou-a",
    "--gpus",
    "2",
    "--hours",
    "3",
]


def make_fixtures(folder: Path) -> None:
    """A warehouse, an instance, a history, header-only and garbage files, a short load."""
    import csv
    import datetime as dt

    import numpy as np

    from market_pipeline.warehouse import open_warehouse

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "dir").mkdir(exist_ok=True)
    open_warehouse(folder / "w.duckdb")
    instance = json.loads((REPO / "tests/market/fixtures/kinked_budget_market.json").read_text())["instance"]
    (folder / "instance.json").write_text(json.dumps(instance))
    rng = np.random.default_rng(0)
    start = dt.datetime(2026, 1, 1)
    rows = ["ts,pool_id,resource_class,price,demand"]
    for i in range(24 * 14):
        for cls in ("guaranteed", "drainable"):
            price = 2.4 * (1 + 0.05 * np.sin(i / 7) + 0.02 * rng.standard_normal())
            demand = 10 * price**-1.2 * (1 + 0.05 * rng.standard_normal())
            rows.append(
                f"{(start + dt.timedelta(hours=i)).isoformat()},A100-80GB@cn-hangzhou-a,{cls},{price:.4f},{demand:.4f}"
            )
    (folder / "history.csv").write_text("\n".join(rows) + "\n")
    (folder / "history_header.csv").write_text(rows[0] + "\n")
    (folder / "garbage.bin").write_bytes(bytes(range(256)) * 40)
    helios = (SHARED / "helios-earth" / "vcLJZ.csv").read_text().splitlines()
    (folder / "load.csv").write_text("\n".join(helios[:601]) + "\n")
    (folder / "helios_header.csv").write_text(helios[0] + "\n")
    table = list(csv.reader(helios[:601]))
    column = table[0].index("total_gpu_num")
    for row in table[1:]:
        row[column] = "1e12"
    with (folder / "load_huge.csv").open("w", newline="") as handle:
        csv.writer(handle).writerows(table)
    # the probes judge the CLI's answer to each bad input: a fixture that came out empty
    # would turn a probe of a bad value into a probe of a missing file
    for name in ("history.csv", "load.csv", "load_huge.csv", "instance.json", "w.duckdb"):
        assert (folder / name).stat().st_size > 0, f"fixture {name} is empty"
    assert len((folder / "load.csv").read_text().splitlines()) == 601, "load.csv lost rows"


def special_inputs(d: str) -> list[list[str]]:
    """The issue's listed examples and other shapes no generic rule makes."""
    w = ["--warehouse", f"{d}/w.duckdb"]
    return [
        ["cost-report", "--tenant", "../../../tmp/x", "--out", f"{d}/out", *w],
        ["cost-report", "--tenant", "nobody-at-all", "--out", f"{d}/out", *w],
        ["migrate", "--warehouse", f"{d}/garbage.bin"],
        ["sql", "select interval 1 month", *w],
        ["sql", "select 'infinity'::timestamp", *w],
        ["forecast", "backtest", "--series", f"{d}/helios_header.csv"],
        ["forecast", "pools", "--demand", f"{d}/history_header.csv"],
        ["scaling-eval", "--load", f"{d}/load.csv", "--max-nodes-factor", "nan"],
        ["scaling-eval", "--load", f"{d}/load.csv", "--pin-probability", "1.5"],
        ["scaling-eval", "--load", f"{d}/load.csv", "--drain-minutes", "-1"],
        ["scaling-eval", "--load", f"{d}/load_huge.csv"],
        ["scaling-eval", "--load", f"{d}/helios_header.csv"],
        ["telemetry", "check", "--partition", "9999-12-31-23:00", *w],
        ["telemetry", "check", "--partition", "nope", *w],
        ["drain-plan", "--scale-down-node", "nope", "--dry-run"],
        ["telemetry", "probe", "--backend", "dcgm", "--endpoint", "http://127.0.0.1:9/metrics"],
        ["telemetry", "probe", "--backend", "dcgm", "--endpoint", "/dev/zero"],
        ["telemetry", "probe", "--backend", "dcgm", "--endpoint", f"{d}/garbage.bin"],
        [*QUOTE, "--warehouse", f"{d}/garbage.bin"],
        ["quote", "--tenant", "acme-research", "--pool", "nope@nowhere", "--gpus", "2", "--hours", "3", *w],
        ["config", "--file", "/dev/zero"],
        ["solve", "--instance", "/dev/zero"],
        ["demand", "fit", "--history", f"{d}/history_header.csv"],
        ["balance", "--tenant", "acme-research", "--top-up", "nan", "--reference", "r", *w],
        ["balance", "--tenant", "acme-research", "--top-up", "-5", "--reference", "r", *w],
        ["balance", "--tenant", "acme-research", "--top-up", "5", *w],
        ["export", "focus", "--from", "2026-01-02", "--to", "2026-01-01", "--out", f"{d}/out/y.csv", *w],
        ["export", "focus", "--from", "2026-01-01", "--to", "2026-01-02", "--out", f"{d}/dir", *w],
        ["billing-rollup", "--start", "nope", *w],
        ["fleet", "advance", "--hours", "nan"],
        ["fleet", "advance", "--hours", "-1"],
        ["fleet", "advance", "--until", "9999-12-31"],
        ["sql", "select 1", "--warehouse", f"{d}/dir"],
        ["sql", "select 1", "--warehouse", "/dev/zero"],
        ["sql", "select 1", *w, "--timeout-seconds", "nan"],
        ["sql", "select 1", *w, "--memory-limit-mb", "-1"],
        ["solve", "--instance", f"{d}/instance.json", "--device", "tpu"],
        ["solve", "--instance", f"{d}/instance.json", "--last-prices", f"{d}/garbage.bin"],
    ]
