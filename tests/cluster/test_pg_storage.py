"""The cluster profile's Dagster storage (`assets/lib/pg_storage.py`, named by
dagster.cluster.yaml): every instance of a process shares one pooled engine, so many storage
operations ride on a couple of connections instead of one each, and a connection the server
dropped is replaced, not used."""

from __future__ import annotations

import uuid
from pathlib import Path

import dagster as dg
import psycopg2
import pytest
from sqlalchemy import event

from assets.lib.pg_storage import MAX_OVERFLOW, POOL_SIZE, shared_engine

pytestmark = pytest.mark.postgres
CLUSTER_YAML = Path(__file__).resolve().parents[2] / "market_pipeline" / "defaults" / "dagster.cluster.yaml"


def test_instances_of_a_process_share_a_few_connections_and_survive_a_dropped_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, control_url: str
) -> None:
    database = dict(part.split("=", 1) for part in control_url.split())["dbname"]
    url = f"postgresql+psycopg2://postgres@127.0.0.1:5432/{database}"
    monkeypatch.setenv("DAGSTER_PG_URL", url)
    home = tmp_path / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text(CLUSTER_YAML.read_text())
    opened: list[object] = []
    with (
        dg.DagsterInstance.from_config(str(home)) as first,
        dg.DagsterInstance.from_config(str(home)) as second,
    ):
        engine = shared_engine(url)
        event.listen(engine, "connect", lambda connection, _record: opened.append(connection))
        run_ids = []
        for i in range(20):  # each add, event and read was a connection of its own before
            instance = first if i % 2 else second
            run = instance.add_run(dg.DagsterRun(job_name="pooled", run_id=str(uuid.uuid4())))
            instance.report_engine_event(f"event {i}", run)
            run_ids.append(run.run_id)
        assert {r.run_id for r in first.get_runs()} == set(run_ids)
        assert len(second.all_logs(run_ids[0])) == 1
        assert 1 <= len(opened) <= POOL_SIZE + MAX_OVERFLOW, len(opened)

        # the server drops every connection of the database (a restart, an idle timeout)
        admin = psycopg2.connect("host=127.0.0.1 port=5432 user=postgres dbname=test")
        admin.autocommit = True
        with admin.cursor() as cursor:
            cursor.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()",
                [database],
            )
        admin.close()
        again = first.add_run(dg.DagsterRun(job_name="pooled", run_id=str(uuid.uuid4())))
        assert second.get_run_by_id(again.run_id) is not None
