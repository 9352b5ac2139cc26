from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from market_pipeline.cli import main
from market_pipeline.lab.simulate.report import REQUIRED_PLACEMENT_KEYS, REQUIRED_STRATEGY_KEYS


def _write_traces(folder: Path, pods: int = 300, seed: int = 0) -> tuple[Path, Path, Path]:
    rng = np.random.default_rng(seed)
    nodes = folder / "nodes.csv"
    rows = ["sn,cpu_milli,memory_mib,gpu,model"]
    rows += [f"node-{i:03d},96000,786432,8,G2" for i in range(6)]
    rows += [f"node-t{i:03d},32000,131072,2,T4" for i in range(6)]
    nodes.write_text("\n".join(rows) + "\n")
    pod_rows = [
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,"
        "deletion_time,scheduled_time"
    ]
    shapes = [(1, 1000), (1, 500), (1, 250), (2, 1000), (8, 1000), (0, 0)]
    for i in range(pods):
        n, m = shapes[int(rng.integers(len(shapes)))]
        qos = "BE" if rng.random() < 0.4 else "LS"
        start = int(rng.integers(0, 10_000))
        life = int(rng.lognormal(np.log(1800), 1.2)) + 60
        pod_rows.append(
            f"p{i:04d},{4000 * max(n, 1)},{8192 * max(n, 1)},{n},{m},,{qos},Running,"
            f"{start},{start + life},{start}"
        )
    pods_path = folder / "pods.csv"
    pods_path.write_text("\n".join(pod_rows) + "\n")
    load = folder / "vc.csv"
    minutes = 3 * 1440
    running = (40 + 20 * np.sin(np.arange(minutes) * 2 * np.pi / 1440)).astype(int)
    lines = ["time,running_gpu_num,pending_gpu_num,total_gpu_num"]
    lines += [f"2020-05-01 00:{i % 60:02d}:00,{running[i]},{i % 3},100" for i in range(minutes)]
    load.write_text("\n".join(lines) + "\n")
    return pods_path, nodes, load


def test_simulate_cli_writes_the_interface_json_and_html(tmp_path, capsys):
    pods, nodes, load = _write_traces(tmp_path)
    out, page = tmp_path / "out.json", tmp_path / "out.html"
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
            "static,utilization,stackelberg",
            "--placement",
            "round_robin,best_fit,fragment_aware",
            "--seed",
            "3",
            "--json",
            str(out),
            "--html",
            str(page),
            "--workers",
            "1",
            "--tenants-per-class",
            "3",
            "--no-progress",
        ]
    )
    assert code == 0
    printed = json.loads(capsys.readouterr().out)
    report = json.loads(out.read_text())
    assert set(report["strategies"]) == {"static", "utilization", "stackelberg"}
    for metrics in report["strategies"].values():
        assert set(REQUIRED_STRATEGY_KEYS) <= set(metrics)
    assert set(report["placement"]) == {"round_robin", "best_fit", "fragment_aware"}
    for row in report["placement"].values():
        assert set(REQUIRED_PLACEMENT_KEYS) <= set(row)
        assert 0 < row["allocation_ratio"] <= 1
    assert printed["json"] == str(out) and "targets" in printed
    html = page.read_text()
    assert html.count("data:image/png;base64,") == 4 and "Strategies" in html


def test_simulate_cli_same_seed_same_report(tmp_path, capsys):
    pods, nodes, load = _write_traces(tmp_path, pods=150)
    reports = []
    for name in ("a.json", "b.json"):
        assert (
            main(
                [
                    "simulate",
                    "--pods",
                    str(pods),
                    "--nodes",
                    str(nodes),
                    "--load",
                    str(load),
                    "--days",
                    "0.25",
                    "--load-start-day",
                    "1",
                    "--strategies",
                    "static,stackelberg",
                    "--placement",
                    "none",
                    "--seed",
                    "7",
                    "--json",
                    str(tmp_path / name),
                    "--workers",
                    "1",
                    "--no-progress",
                ]
            )
            == 0
        )
        reports.append(json.loads((tmp_path / name).read_text()))
    capsys.readouterr()
    assert (
        reports[0]["strategies"]["stackelberg"]["revenue"]
        == reports[1]["strategies"]["stackelberg"]["revenue"]
    )
    assert reports[0]["placement"] == {}


@pytest.mark.parametrize(
    "change, message",
    [
        (["--strategies", "static,auction"], "strategies"),
        (["--load", "missing.csv"], "missing.csv"),
    ],
)
def test_simulate_cli_rejects_bad_input_naming_it(tmp_path, capsys, change, message):
    pods, nodes, load = _write_traces(tmp_path, pods=50)
    args = [
        "simulate",
        "--pods",
        str(pods),
        "--nodes",
        str(nodes),
        "--load",
        str(load),
        "--days",
        "0.25",
        "--load-start-day",
        "1",
        "--placement",
        "none",
        "--json",
        str(tmp_path / "x.json"),
        "--no-progress",
    ]
    index = args.index(change[0]) if change[0] in args else None
    if index is not None:
        args[index + 1] = str(tmp_path / change[1]) if change[1].endswith(".csv") else change[1]
    else:
        args += change
    assert main(args) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "x.json").exists()


def test_simulate_cli_rejects_a_pod_list_without_columns(tmp_path, capsys):
    pods, nodes, load = _write_traces(tmp_path, pods=20)
    pods.write_text("name,cpu_milli\np1,1000\n")
    assert (
        main(
            [
                "simulate",
                "--pods",
                str(pods),
                "--nodes",
                str(nodes),
                "--load",
                str(load),
                "--json",
                str(tmp_path / "x.json"),
                "--no-progress",
            ]
        )
        == 2
    )
    assert "missing columns" in capsys.readouterr().err


def _shared_traces(folder: Path, pods: int, edit_load: Callable[[list[str]], None] | None = None) -> Path:
    """`_write_traces` laid out as the shared traces folder `bench guarantee --data` reads
    (the default openb sample and node list, one Helios cluster `vcA`); `edit_load` may change
    the load file's lines (header first) before they are written."""
    data = folder / "data"
    (data / "alibaba-gpu-2023").mkdir(parents=True)
    (data / "helios-earth").mkdir()
    pod_list, nodes, load = _write_traces(folder, pods=pods)
    (data / "alibaba-gpu-2023" / "openb_pod_list_default.csv").write_text(pod_list.read_text())
    (data / "alibaba-gpu-2023" / "openb_node_list_gpu_node.csv").write_text(nodes.read_text())
    lines = load.read_text().splitlines()
    if edit_load is not None:
        edit_load(lines)
    (data / "helios-earth" / "vcA.csv").write_text("\n".join(lines) + "\n")
    return data


@pytest.mark.parametrize(
    "change, message",
    [(["--pods", "missing.csv"], "missing.csv"), (["--seeds", "7,x"], "--seeds")],
)
def test_bench_guarantee_rejects_bad_input_naming_it(tmp_path, capsys, change, message):
    data = _shared_traces(tmp_path, pods=50)
    value = str(tmp_path / change[1]) if change[1].endswith(".csv") else change[1]
    args = ["bench", "guarantee", "--data", str(data), change[0], value, "--json", str(tmp_path / "g.json")]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and message in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "g.json").exists()


def test_bench_guarantee_moves_its_window_off_a_gap_in_the_load_with_load_start_day(tmp_path, capsys):
    """The gap's refusal names the nearest `--load-start-day` whose window (warm-up included)
    has none, a whole day where one serves; `bench guarantee` takes it and runs there (here
    with the premium-only yardstick beside the week)."""

    def outage(lines: list[str]) -> None:  # seven idle hours from day 1: an outage, not idleness
        for i in range(1440, 1440 + 7 * 60):
            lines[1 + i] = f"{lines[1 + i].split(',')[0]},0,0,100"

    data = _shared_traces(tmp_path, pods=80, edit_load=outage)
    out = tmp_path / "g.json"
    args = ["bench", "guarantee", "--data", str(data), "--days", "0.25", "--warmup-days", "0.25"]
    args += ["--workers", "1", "--json", str(out)]
    assert main([*args, "--load-start-day", "1.25"]) == 2
    err = capsys.readouterr().err
    assert "gap at day 1.00" in err and len(err.strip().splitlines()) == 1
    assert err.strip().endswith("the nearest window without one: --load-start-day 2")
    assert not out.exists()
    assert main([*args, "--load-start-day", "2.0", "--premium-only"]) == 0
    report = json.loads(out.read_text())
    assert report["summary"]["load_start_day"] == 2.0
    assert report["summary"]["premium_follows_reach"] is False  # the default: the cap alone
    assert report["summary"]["drainable_leaves_expected_claim"] is False  # the default
    assert [w["week"] for w in report["weeks"]] == ["default/vcA/s7"]
    premium = report["weeks"][0]["after"]["premium_only"]  # static plus the premium, beside the verdict
    assert set(premium) == {
        "revenue_vs_static",
        "rigid_sla_violations",
        "rigid_waiting_at_end",
        "rigid_breach_ticks",
    }
