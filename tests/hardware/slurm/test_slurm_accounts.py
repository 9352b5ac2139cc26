"""The slurm backend with accounts, on real daemons: a local cluster (2 nodes x 2 GPUs) with a
private MariaDB and slurmdbd, one Slurm account per configured tenant (`sacctmgr`),
`AccountingStorageEnforce=associations` and `AccountingStorageTRES=gres/gpu`, started once
for this module under a temporary home.

Skipped, with the reason, where Slurm, slurmdbd or MariaDB are not installed (`.ci/run`
installs them) or the suite does not run as root (slurmd must).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from decimal import Decimal

import polars as pl
import pytest
from test_slurm_cluster import wait_for  # the one bounded poll of the Slurm tests

from market_pipeline.billing.metering import HourWindow, meter_window
from market_pipeline.billing.metering_source import pool_directory
from market_pipeline.config import load_config
from market_pipeline.hardware.slurm.adapter import SlurmAdapter, split_task_id, task_id_of
from market_pipeline.hardware.slurm.client import SlurmError
from market_pipeline.hardware.slurm.cluster import ClusterSpec, LocalCluster, NodeGroup, missing_binaries
from market_pipeline.hardware.slurm.parse import JobRun
from market_pipeline.hardware.slurm.workload import JobSpec, submit

MISSING = missing_binaries(accounting=True)
pytestmark = [
    pytest.mark.skipif(bool(MISSING), reason=f"Slurm accounting not installed: missing {MISSING}"),
    pytest.mark.skipif(os.geteuid() != 0, reason="the local Slurm cluster runs slurmd, which needs root"),
]
UTC = timezone.utc
TENANTS = tuple(t.id for t in load_config().tenants)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    spec = ClusterSpec(
        groups=(NodeGroup("a100_80gb", "cn-hangzhou-a", 1, 2, 8), NodeGroup("h800", "cn-beijing-b", 1, 2, 8)),
        kill_wait_seconds=2,
        min_job_age_seconds=120,
        accounts=TENANTS,
    )
    local = LocalCluster(tmp_path_factory.mktemp("slurm_accounts"), spec)
    local.up(timeout_seconds=90)
    yield local
    local.down()


def _task(adapter: SlurmAdapter, job_id: str):
    return next((t for t in adapter.list_tasks() if split_task_id(t.task_id)[0] == job_id), None)


def test_each_tenant_is_an_account_and_a_job_of_an_unknown_account_is_rejected(
    cluster: LocalCluster, adapter: SlurmAdapter
) -> None:
    assert adapter.accounting
    assert set(TENANTS) <= set(adapter.accounts())
    jobs = cluster.home / "jobs"
    with pytest.raises(SlurmError, match="Invalid account"):
        submit(cluster.client(), [JobSpec("no-such-tenant", "h800", 1, 30, drainable=False)], jobs)
    assert not [j for j in adapter.slurm_jobs() if j.account == "no-such-tenant"]
    # a tenant's job is accepted and runs as the tenant's task
    [job] = submit(cluster.client(), [JobSpec("cobalt-labs", "h800", 1, 30, drainable=False)], jobs)
    task = wait_for(lambda: _task(adapter, job), 30, "the tenant's job running")
    assert task.tenant_id == "cobalt-labs" and len(task.gpu_uuids) == 1
    assert adapter.terminate_task(task.task_id, 10).ok


@pytest.mark.slow
def test_per_job_gpu_accounting_in_sacct_agrees_with_the_backends_metering(
    cluster: LocalCluster, adapter: SlurmAdapter
) -> None:
    started = datetime.now(UTC) - timedelta(seconds=5)
    jobs = cluster.home / "jobs"
    [job] = submit(cluster.client(), [JobSpec("acme-research", "a100_80gb", 2, 4, drainable=False)], jobs)
    task = wait_for(lambda: _task(adapter, job), 30, "the job running")  # seen running: metered
    assert len(task.gpu_uuids) == 2

    def ended() -> JobRun | None:
        runs = adapter.ended_runs(started, datetime.now(UTC) + timedelta(minutes=1))
        return next((r for r in runs if r.job_id == job), None)

    run = wait_for(ended, 60, "slurmdbd's record of the ended job")
    assert (run.account, run.state, run.gpus, task_id_of(run)) == (
        "acme-research",
        "COMPLETED",
        2,
        task.task_id,
    )
    # sacct itself, read apart from the backend's parser: the job's GPU TRES and run time
    line = cluster.client().run(
        [
            "sacct",
            "--noheader",
            "--parsable2",
            "--allocations",
            "--jobs",
            job,
            "--format=AllocTRES,ElapsedRaw,Account",
        ]
    )
    tres, elapsed, account = line.strip().split("|")
    assert "gres/gpu=2" in tres.split(",") and account == "acme-research"
    assert int(elapsed) == run.seconds >= 4
    # metering the hour(s) of the run from the backend's events: GPU-seconds = GPUs x run time
    events = adapter.read_task_events(started - timedelta(hours=1), datetime.now(UTC) + timedelta(minutes=1))
    ours = events.filter(pl.col("task_id") == task.task_id)
    assert ours["event"].to_list() == ["start", "end"] and ours["reason"].to_list()[1] == "COMPLETED"
    pools = pool_directory(load_config(), adapter.list_nodes())
    hours = sorted({HourWindow.containing(run.start).start, HourWindow.containing(run.end).start})
    intervals = pl.concat(
        meter_window(ours, adapter.task_catalog([task.task_id]), HourWindow(h, h + timedelta(hours=1)), pools)
        for h in hours
    )
    assert set(intervals["gpu_uuid"]) == set(task.gpu_uuids) and set(intervals["tenant_id"]) == {
        "acme-research"
    }
    metered = sum(
        (r["ended_at"] - r["started_at"]).total_seconds() * float(r["gpu_fraction"])
        for r in intervals.iter_rows(named=True)
    )
    assert metered == 2 * int(elapsed)
    assert set(intervals["gpu_fraction"]) == {Decimal(1)}
