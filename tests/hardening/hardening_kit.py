"""Helpers of the hardening tests: a small warehouse, a checksum, the CLI run in-process.

`run_cli` returns (exit status, stdout, stderr) and turns argparse's SystemExit into its
status, so a test can assert "one line, non-zero, no traceback" for any argv.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import io
import shutil
import tempfile
from pathlib import Path

from market_pipeline.cli import INTERNAL_ERROR, main
from market_pipeline.warehouse import open_warehouse

REPO_ROOT = Path(__file__).resolve().parents[2]
TENANT = "acme-research"
OTHER = "cobalt-labs"
USAGE_ROWS = 240
_TEMPLATE_FOLDERS: list[tempfile.TemporaryDirectory] = []  # removed when the process ends


def build_warehouse(path: Path) -> Path:
    """A migrated warehouse with two tenants' ledger rows and a rated-usage table at `path`: a
    copy of one built once per process (migrating and seeding a file per test cost more than
    the test). Each caller gets a file of its own to write to."""
    shutil.copyfile(_seeded_template(), path)
    return path


@functools.cache
def _seeded_template() -> Path:
    """The warehouse `build_warehouse` copies, checkpointed (no WAL beside it), in a folder that
    lives as long as this process."""
    folder = tempfile.TemporaryDirectory(prefix="hardening-template-")
    _TEMPLATE_FOLDERS.append(folder)
    path = Path(folder.name) / "warehouse.duckdb"
    warehouse = open_warehouse(path)
    with warehouse.connect() as con:
        con.execute(
            "INSERT INTO billing_ledger VALUES"
            f" ('top_up:{TENANT}:seed', '{TENANT}', 'top_up', 5, NULL, now(), 'seed'),"
            f" ('top_up:{OTHER}:seed', '{OTHER}', 'top_up', 7, NULL, now(), 'seed')"
        )
        con.execute(
            f"CREATE TABLE fct_rated_usage AS SELECT '{TENANT}' AS tenant_id, i AS n"
            f" FROM range({USAGE_ROWS}) t(i) UNION ALL SELECT '{OTHER}', 1"
        )
        con.execute("CHECKPOINT")
    assert not path.with_name(path.name + ".wal").exists()
    return path


def checksum(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def run_cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(list(argv))
        except SystemExit as exc:  # argparse: usage line + error line, status 2
            code = exc.code if isinstance(exc.code, int) else 2
    return code, out.getvalue(), err.getvalue()


def clear_refusal(code: int, err: str) -> bool:
    """Non-zero, not a defect, no traceback, and one `error:` line (or argparse's two)."""
    lines = [line for line in err.splitlines() if line.strip() and "it/s" not in line]
    if code in (0, INTERNAL_ERROR) or "Traceback" in err:
        return False
    if lines and lines[0].startswith("usage:"):
        return lines[-1].startswith("market-pipeline") and ": error: " in lines[-1]
    return len(lines) == 1 and ("error" in lines[0])
