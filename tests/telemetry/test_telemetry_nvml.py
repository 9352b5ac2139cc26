"""The nvml backend against a fake pynvml module (and the real one, which finds no GPU here)."""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from telemetry_fake_pynvml import GIB, FakeGpu, FakeMig, FakeNvml, assert_outcome_ok  # noqa: E402

from market_pipeline.hardware.nvml.adapter import NO_DEVICE_PREFIX, NvmlAdapter  # noqa: E402
from market_pipeline.hardware.protocol import NodeAdapter, OutcomeStatus  # noqa: E402

NOW = datetime(2024, 6, 1, 12, 0, tzinfo=timezone.utc)


def fleet(pid: int = 4242) -> FakeNvml:
    return FakeNvml(
        [
            FakeGpu("GPU-aaa", pids=[(pid, 8 * GIB)]),
            FakeGpu("GPU-bbb", util=3),
            FakeGpu(
                "GPU-ccc",
                nvlink_group=None,
                migs=[
                    FakeMig("MIG-c1", "3g.71gb", 1, 70 * GIB, 5 * GIB, pids=[(pid + 1, GIB)]),
                    FakeMig("MIG-c2", "4g.71gb", 2, 70 * GIB, 0, gpm_util=None),
                ],
            ),
        ]
    )


def adapter_for(nvml: FakeNvml, **kwargs) -> NvmlAdapter:
    return NvmlAdapter(nvml=nvml, node_id="h200-a", clock=lambda: NOW, gpm_interval_seconds=0, **kwargs)


def test_telemetry_nvml_lists_gpus_mig_instances_and_nvlink_peers() -> None:
    adapter = adapter_for(fleet())
    assert isinstance(adapter, NodeAdapter)
    assert adapter.probe().ok
    (node,) = adapter.list_nodes()
    assert (node.node_id, node.gpus, node.nvlink, node.gpu_model) == ("h200-a", 3, True, "NVIDIA H200")
    gpus = {g.gpu_uuid: g for g in adapter.list_gpus()}
    assert set(gpus) == {"GPU-aaa", "GPU-bbb", "MIG-c1", "MIG-c2"}  # MIG parent via instances
    assert gpus["GPU-aaa"].nvlink_peers == ("GPU-bbb",)
    assert gpus["MIG-c1"].mig_profile == "3g.71gb" and gpus["MIG-c1"].memory_total_mib == 71680


def test_telemetry_nvml_samples_are_canonical_and_name_tasks() -> None:
    nvml = fleet(pid=os.getpid())
    nvml.pending_xids = [(0, 79), (0, 48)]
    adapter = adapter_for(nvml)
    samples = adapter.read_samples(NOW - timedelta(minutes=1), NOW + timedelta(minutes=1))
    rows = {r["gpu_uuid"]: r for r in samples.to_dicts()}
    assert set(rows) == {"GPU-aaa", "GPU-bbb", "MIG-c1", "MIG-c2"}
    assert rows["GPU-aaa"]["power_w"] == 412.0 and rows["GPU-aaa"]["mem_used_mib"] == 10240.0
    assert rows["GPU-aaa"]["task_id"] == f"pid-{os.getpid()}"
    assert rows["GPU-aaa"]["xid_errors"] == 2 and rows["GPU-bbb"]["xid_errors"] == 0
    assert rows["MIG-c1"]["sm_util_pct"] == 37.5  # from GPM
    assert rows["MIG-c2"]["sm_util_pct"] is None  # GPM had no value: validation will say so
    again = adapter.read_samples(NOW, NOW + timedelta(seconds=1))
    assert again.filter(again["gpu_uuid"] == "GPU-aaa")["xid_errors"].item() == 0
    assert adapter.read_samples(NOW + timedelta(hours=1), NOW + timedelta(hours=2)).is_empty()


def test_telemetry_nvml_tasks_read_ids_from_the_process_environment() -> None:
    env = dict(os.environ, MARKET_TASK_ID="task-77", MARKET_TENANT_ID="acme-research")
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], env=env)
    try:
        adapter = adapter_for(fleet(pid=child.pid))
        tasks = {t.task_id: t for t in adapter.list_tasks()}
        task = tasks["task-77"]
        assert task.tenant_id == "acme-research" and task.pid == child.pid
        assert task.gpu_uuids == ("GPU-aaa",) and task.mem_mib == 8192
        assert abs((task.started_at - datetime.now(timezone.utc)).total_seconds()) < 60
        outcome = adapter.terminate_task("task-77", timeout_seconds=10)
        assert_outcome_ok(outcome)
        assert child.wait(timeout=5) == -15  # SIGTERM really reached the process
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert adapter.terminate_task("no-such-task", 1).status is OutcomeStatus.GONE


def test_telemetry_nvml_verify_released_checks_compute_processes() -> None:
    adapter = adapter_for(fleet())
    assert adapter.verify_released(["GPU-bbb", "MIG-c2"]).ok
    busy = adapter.verify_released(["GPU-aaa"])
    assert busy.status is OutcomeStatus.FAILED and "4242" in busy.detail
    assert adapter.verify_released(["GPU-zzz"]).status is OutcomeStatus.GONE
    assert adapter.warn_task("x", 1).status is OutcomeStatus.UNSUPPORTED
    cordon = adapter.cordon(adapter.node_id)
    assert cordon.status is OutcomeStatus.UNSUPPORTED and "no scheduler" in cordon.detail


def test_telemetry_nvml_without_a_driver_is_a_clear_outcome() -> None:
    adapter = adapter_for(FakeNvml([], init_error=12))
    outcome = adapter.probe()
    assert outcome.status is OutcomeStatus.NO_DEVICE
    assert outcome.detail.startswith(NO_DEVICE_PREFIX)
    assert adapter.list_nodes() == [] and adapter.list_gpus() == [] and adapter.list_tasks() == []
    assert adapter.read_samples(NOW, NOW + timedelta(seconds=1)).is_empty()
    assert adapter.verify_released(["GPU-a"]).status is OutcomeStatus.NO_DEVICE
    snapshot = adapter.snapshot()
    assert snapshot["status"] == "no_device" and "gpus" not in snapshot


def test_telemetry_nvml_zero_gpus_is_no_device() -> None:
    outcome = adapter_for(FakeNvml([])).probe()
    assert outcome.status is OutcomeStatus.NO_DEVICE and "0 GPUs" in outcome.detail


def test_telemetry_nvml_real_library_on_this_host_never_crashes() -> None:
    adapter = NvmlAdapter(timeout_seconds=5)
    outcome = adapter.probe()
    if outcome.ok:
        pytest.skip("this host has an NVIDIA GPU; the device run covers it")
    assert outcome.status is OutcomeStatus.NO_DEVICE and NO_DEVICE_PREFIX in outcome.detail
    assert adapter.list_gpus() == []


def test_telemetry_nvml_snapshot_lists_everything_for_the_probe() -> None:
    snapshot = adapter_for(fleet()).snapshot()
    assert snapshot["status"] == "ok" and snapshot["versions"]["driver"] == "560.35.03"
    assert [g["uuid"] for g in snapshot["gpus"]] == ["GPU-aaa", "GPU-bbb", "GPU-ccc"]
    assert [m["uuid"] for m in snapshot["mig_instances"]] == ["MIG-c1", "MIG-c2"]
    assert {p["pid"] for p in snapshot["processes"]} == {4242, 4243}
    assert len(snapshot["samples"]) == 4 and snapshot["gpus"][0]["nvlink_peers"] == ["GPU-bbb"]


def test_telemetry_nvml_is_built_from_the_config() -> None:
    from market_pipeline.config import load_config
    from market_pipeline.hardware import make_adapter

    adapter = make_adapter(
        load_config(environ={"MP__ADAPTER__BACKEND": "nvml", "MP__ADAPTER__OPERATION_TIMEOUT_SECONDS": "3"})
    )
    assert isinstance(adapter, NvmlAdapter) and adapter.timeout_seconds == 3.0
