"""The full CLI probe: every subcommand's numeric and path options with bad values, one at a time.

A tool run by hand, not a test (it takes minutes): `python .ci/cli_probe.py DIR [--only CMD]
[--json OUT]` (docs/cli_probe.md). DIR holds the probe's fixtures (made by
`tests/hardening/probe_inputs.make_fixtures`). Each input runs in a forked child of one
process that imported the CLI once, with a time limit; the outcome is one of

- refused:  exit not 0 or 70, one `error:` line on stderr, no traceback (what we want);
- accepted: exit 0 on a bad value (a defect unless the value is in fact valid);
- internal: exit 70 or a traceback;
- messy:    refused, but not as one line;
- hung:     still running at the time limit;
- valid:    exit 0 on a generated value that is in fact valid (`ZERO_IS_VALID`).

`tests/hardening/test_hardening_probe.py` runs a fast selection of these inputs in the suite.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "hardening"))  # the probe's inputs, shared with the suite

from probe_inputs import QUOTE, SHARED, make_fixtures, special_inputs  # noqa: E402

SKIP = ("bench", "demo")
NUMERIC_BAD = ("nan", "inf", "-1", "1e12", "0")
PATH_BAD = ("{dir}/dir", "/dev/zero", "{dir}/garbage.bin", "{dir}/nonexistent.csv")
# options whose value names a file the command reads (writes are probed separately)
READ_PATHS = {
    "--file",
    "--instance",
    "--config",
    "--warehouse",
    "--series",
    "--demand",
    "--load",
    "--nodes",
    "--pods",
    "--history",
    "--last-prices",
    "--endpoint",
    "--data-dir",
}


def baselines(d: str) -> dict[str, list[str]]:
    """A valid argv per leaf command: the probe changes one option of it at a time."""
    w = ["--warehouse", f"{d}/w.duckdb"]
    openb = SHARED / "alibaba-gpu-2023"
    return {
        "sql": ["sql", "select 1", *w],
        "tenant-sql": ["tenant-sql", "--tenant", "acme-research", "select 1", *w],
        "migrate": ["migrate", *w],
        "config": ["config"],
        "drain-plan": ["drain-plan", "--dry-run", "--json"],
        "forecast backtest": ["forecast", "backtest", "--series", f"{d}/load.csv", "--json"],
        "forecast pools": ["forecast", "pools", "--demand", f"{d}/history.csv", "--json"],
        "solve": ["solve", "--instance", f"{d}/instance.json", "--json"],
        "telemetry check": ["telemetry", "check", "--partition", "2026-01-01-00:00", *w, "--json"],
        "telemetry probe": [
            "telemetry",
            "probe",
            "--backend",
            "dcgm",
            "--endpoint",
            str(REPO / "tests/fixtures/dcgm_metrics.txt"),
            "--json",
        ],
        "scaling-eval": ["scaling-eval", "--load", f"{d}/load.csv", "--json"],
        "fleet status": ["fleet", "status"],
        "placement replay": [
            "placement",
            "replay",
            "--nodes",
            str(openb / "openb_node_list_gpu_node.csv"),
            "--pods",
            str(openb / "openb_pod_list_default.csv"),
            "--policy",
            "best_fit",
        ],
        "quote": [*QUOTE, *w, "--json"],
        "cost-report": ["cost-report", "--tenant", "acme-research", "--json", "--out", f"{d}/out", *w],
        "balance": ["balance", "--tenant", "acme-research", *w],
        "export": [
            "export",
            "focus",
            "--from",
            "2026-01-01",
            "--to",
            "2026-01-02",
            "--out",
            f"{d}/out/x.csv",
            *w,
        ],
        "demand fit": ["demand", "fit", "--history", f"{d}/history.csv", "--json"],
    }


def generated_inputs(d: str) -> list[list[str]]:
    """Each baseline with one numeric option set to a bad number or one read path to a bad file."""
    from market_pipeline.cli import build_parser

    parser = build_parser()
    leaves = _leaves(parser)
    inputs: list[list[str]] = []
    for name, base in baselines(d).items():
        sub = leaves[name]
        for action in sub._actions:
            option = next((o for o in action.option_strings if o.startswith("--")), None)
            if option is None or action.nargs == 0 or action.choices:
                continue
            numeric = action.type in (int, float) or getattr(action.type, "numeric", False)
            if numeric:
                values = NUMERIC_BAD
            elif option in READ_PATHS:
                values = tuple(v.format(dir=d) for v in PATH_BAD)
            else:
                continue
            for value in values:
                inputs.append(_with(base, option, value))
    return inputs


def _leaves(parser: argparse.ArgumentParser, prefix: str = "") -> dict[str, argparse.ArgumentParser]:
    out: dict[str, argparse.ArgumentParser] = {}
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        return {prefix.strip(): parser}
    for action in subs:
        for name, sub in action.choices.items():
            if not prefix and name in SKIP:
                continue
            out.update(_leaves(sub, f"{prefix} {name}"))
    return out


def _with(base: list[str], option: str, value: str) -> list[str]:
    argv = list(base)
    if option in argv:
        argv[argv.index(option) + 1] = value
    else:
        argv += [option, value]
    return argv


# Probe values that are in fact valid: exit 0 is the right answer for them.
ZERO_IS_VALID = {
    "--seed",
    "--warm-nodes",
    "--cold-delay",
    "--warm-delay",
    "--drain-minutes",
    "--pin-probability",
    "--lag-hours",
    "--lag-keep-z",
}


def valid_input(argv: list[str]) -> bool:
    """A generated input whose "bad" value is a valid one (0 where 0 means something; a new
    warehouse for `migrate`)."""
    if argv[0] == "migrate" and argv[-1].endswith("nonexistent.csv"):
        return True
    return len(argv) >= 2 and argv[-1] == "0" and argv[-2] in ZERO_IS_VALID


def classify(code: int, err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    if code == 70 or "Traceback" in err or "panicked" in err:
        return "internal"
    if code == 0:
        return "accepted"
    if len(lines) == 1 and lines[0].startswith("error"):
        return "refused"
    return "messy"


def run_one(argv: list[str], limit: float, home: str) -> tuple[str, int, str]:
    """`main(argv)` in a forked child; (outcome, exit status, stderr's last line)."""
    with tempfile.TemporaryFile() as err_file:
        pid = os.fork()
        if pid == 0:  # the child: run the command, exit with its status
            os.environ["MARKET_PIPELINE_HOME"] = home
            os.environ["DAGSTER_HOME"] = home
            os.chdir(REPO)
            signal.alarm(int(limit))
            err = io.StringIO()
            code = 1
            try:
                with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
                    from market_pipeline.cli import main

                    try:
                        code = main(argv)
                    except SystemExit as exc:
                        code = exc.code if isinstance(exc.code, int) else 2
            except BaseException as exc:  # noqa: BLE001 - the probe records everything
                err.write(f"Traceback (probe): {type(exc).__name__}: {exc}\n")
                code = 70
            os.write(err_file.fileno(), err.getvalue().encode(errors="replace"))
            os._exit(code if isinstance(code, int) and 0 <= code < 256 else 1)
        started = time.monotonic()
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            if time.monotonic() - started > limit + 5:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                return "hung", -9, ""
            time.sleep(0.05)
        err_file.seek(0)
        err = err_file.read().decode(errors="replace")
    if os.WIFSIGNALED(status):
        return ("hung" if os.WTERMSIG(status) == signal.SIGALRM else "internal"), -os.WTERMSIG(status), err
    code = os.WEXITSTATUS(status)
    last = (err.strip().splitlines() or [""])[-1]
    return classify(code, err), code, last


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("folder")
    parser.add_argument("--only", default=None, help="probe only argvs starting with this word")
    parser.add_argument("--limit", type=float, default=60.0)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    folder = Path(args.folder)
    if not (folder / "w.duckdb").exists():
        make_fixtures(folder)
    d = str(folder)
    inputs = special_inputs(d) + generated_inputs(d)
    if args.only:
        inputs = [a for a in inputs if a[0] == args.only]
    import market_pipeline.cli  # noqa: F401 - imported once, before the forks

    results = []
    with tempfile.TemporaryDirectory() as home:
        for argv in inputs:
            outcome, code, last = run_one(argv, args.limit, home)
            if outcome == "accepted" and valid_input(argv):
                outcome = "valid"
            # `migrate` makes a warehouse at the "nonexistent" path: later inputs must not find one
            (folder / "nonexistent.csv").unlink(missing_ok=True)
            results.append({"argv": argv, "outcome": outcome, "code": code, "stderr": last[:200]})
            if outcome != "refused":
                print(f"{outcome:9s} {code:4d} {' '.join(argv)} :: {last[:160]}", flush=True)
    counts: dict[str, int] = {}
    for row in results:
        counts[row["outcome"]] = counts.get(row["outcome"], 0) + 1
    print(json.dumps({"inputs": len(results), **dict(sorted(counts.items()))}))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
