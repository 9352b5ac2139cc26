"""Issue 23's drain attack list, repeated: counts double signals and processes left behind.

python tests/drain/drain_attacks.py [--rounds N]   (from the repository root)
Prints one JSON object: scenarios run, signals delivered, double signals (a process that
got the same signal twice), processes of drained tasks left running, resumed drains whose
SIGTERM came before the full notice, and refused commands that wrote something.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

sys.path[:0] = [str(Path(__file__).parents[2]), str(Path(__file__).parent)]  # this checkout
from drain_targets import cli, fork_cli, start_target  # noqa: E402

WARN, GRACE = 1.0, 1.0


def argv(pid: int, audit: str, warn: float = WARN, grace: float = GRACE) -> list[str]:
    return [
        "drain",
        "--backend",
        "local-process",
        "--pid",
        str(pid),
        "--warn-seconds",
        str(warn),
        "--timeout-seconds",
        str(grace),
        "--audit",
        audit,
        "--json",
    ]


def tree(tmp: Path, audit: str, flags: tuple[str, ...]) -> dict:
    target = start_target(tmp, *flags)
    run = fork_cli(argv(target.pids[0], audit, 0.3, 0.8), tmp / "tree.out")
    run.join(60)
    return {"target": target, "processes": len(target.pids)}


def concurrent(tmp: Path, audit: str) -> dict:
    target = start_target(tmp)
    runs = [fork_cli(argv(target.pids[0], audit), tmp / f"c{i}.out") for i in range(2)]
    for run in runs:
        run.join(60)
    return {"target": target, "processes": 1}


def resumed(tmp: Path, audit: str) -> dict:
    target = start_target(tmp)
    warn = 2.0
    first = fork_cli(argv(target.pids[0], audit, warn, 1.5), tmp / "r1.out")
    deadline = time.monotonic() + 30
    while not target.signals() and time.monotonic() < deadline:
        time.sleep(0.02)
    time.sleep(0.2)
    os.kill(first.pid, signal.SIGKILL)
    first.join()
    rerun = fork_cli(argv(target.pids[0], audit, warn, 1.5), tmp / "r2.out")
    rerun.join(60)
    lines = (tmp / "r2.out").read_text().strip().splitlines()
    outcome = json.loads(lines[-1])["outcome"] if lines and lines[-1].startswith("{") else lines
    if not any(s == "SIGTERM" for _, s in target.signals()):
        # No SIGTERM at all: the drain's hard bound (max_total_seconds) ran out first.
        return {"target": target, "processes": 1, "outcome": outcome}
    notice = target.first("SIGTERM") - target.first("SIGUSR1")
    return {
        "target": target,
        "processes": 1,
        "short_notice": notice < warn - 0.05,
        "notice_seconds": round(notice, 2),
        "outcome": outcome,
    }


def refused_wrote(tmp: Path) -> int:
    """Refused commands (missing, protected pids; NaN/inf durations): files they wrote."""
    home = tmp / "refused-home"
    home.mkdir()
    os.environ["MARKET_PIPELINE_HOME"] = str(home)
    sink = open(os.devnull, "w")
    saved = sys.stdout, sys.stderr
    sys.stdout = sys.stderr = sink
    try:
        for pid in ("1", str(os.getpid()), str(os.getppid()), "3999999", "10" * 10):
            cli(
                [
                    "drain",
                    "--backend",
                    "local-process",
                    "--pid",
                    pid,
                    "--warn-seconds",
                    "0.1",
                    "--timeout-seconds",
                    "0.1",
                ]
            )
        for bad in ("nan", "inf", "0", "-1"):
            cli(["drain", "--backend", "local-process", "--pid", str(os.getpid()), f"--warn-seconds={bad}"])
    finally:
        sys.stdout, sys.stderr = saved
    return len(list(home.rglob("*")))


def main() -> None:
    import market_pipeline

    assert Path(market_pipeline.__file__).parents[1] == Path(__file__).parents[2], (
        f"run from the repository root: imported {market_pipeline.__file__}"
    )
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=2)
    rounds = parser.parse_args().rounds
    counts = {
        "scenarios": 0,
        "processes": 0,
        "signals": 0,
        "double_signals": 0,
        "left_behind": 0,
        "short_notice": 0,
        "notices_seconds": [],
        "resumed_outcomes": [],
    }
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        os.environ["MARKET_PIPELINE_HOME"] = str(tmp / "home")
        for round_no in range(rounds):
            for audit in ("memory", "warehouse"):
                work = tmp / f"{round_no}-{audit}"
                work.mkdir()
                for scenario in (
                    lambda: tree(work, audit, ("--setsid", "--children", "5", "--orphans", "2")),
                    lambda: tree(work, audit, ("--children", "3", "--deaf-children")),
                    lambda: concurrent(work, audit),
                    lambda: resumed(work, audit),
                ):
                    result = scenario()
                    target = result["target"]
                    time.sleep(0.1)
                    received = target.signals()
                    counts["scenarios"] += 1
                    counts["processes"] += result["processes"]
                    counts["signals"] += sum(received.values())
                    counts["double_signals"] += sum(n - 1 for n in received.values() if n > 1)
                    counts["left_behind"] += len(target.left())
                    counts["short_notice"] += int(result.get("short_notice", False))
                    if "notice_seconds" in result:
                        counts["notices_seconds"].append(result["notice_seconds"])
                    if "outcome" in result:
                        counts["resumed_outcomes"].append(result["outcome"])
                    target.cleanup()
        counts["refused_commands_files_written"] = refused_wrote(tmp)
    print(json.dumps(counts))


if __name__ == "__main__":
    main()
