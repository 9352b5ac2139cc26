import subprocess
import sys


def test_parser_builds_without_heavy_imports():
    """Every command registers without loading torch, SciPy or scikit-learn, so that a
    drain from the command line starts within its W + T + small-constant bound."""
    code = (
        "import sys, market_pipeline.cli as c; c.build_parser(); "
        "print(','.join(m for m in ('torch', 'scipy', 'sklearn', 'dagster') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_every_interface_command_is_registered():
    from market_pipeline.cli import build_parser

    parser = build_parser()
    commands = parser._subparsers._group_actions[0].choices
    for name in (
        "sql",
        "solve",
        "telemetry",
        "forecast",
        "drain",
        "scaling-eval",
        "quote",
        "cost-report",
        "simulate",
        "bench",
    ):
        assert name in commands, name
    bench = commands["bench"]._subparsers._group_actions[0].choices
    for target in ("solver", "ingest", "forecast", "billing", "placement"):
        assert target in bench, target
