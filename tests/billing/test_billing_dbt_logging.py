"""dbt's debug file log is off for in-process runs unless DBT_LOG_LEVEL_FILE asks for it."""

from __future__ import annotations

from market_pipeline.billing.dbt_project import DBT_FILE_LOG_ENV, DBT_PROJECT_DIR, run_dbt

LOG = DBT_PROJECT_DIR / "logs" / "dbt.log"
LIST = ["ls", "--select", "stg_billing_terms"]


def _log_size() -> int:
    return LOG.stat().st_size if LOG.exists() else 0


def test_billing_dbt_file_log_is_written_only_when_asked(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv(DBT_FILE_LOG_ENV, raising=False)
    warehouse = tmp_path / "w.duckdb"
    run_dbt(LIST, warehouse)  # the first call may parse the project (which logs)
    before = _log_size()
    run_dbt(LIST, warehouse)
    assert _log_size() == before
    monkeypatch.setenv(DBT_FILE_LOG_ENV, "debug")
    run_dbt(LIST, warehouse)
    assert _log_size() > before
    assert "stg_billing_terms" in capsys.readouterr().out
