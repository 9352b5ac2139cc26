"""Drains through the nvml backend (fake NVML, real processes): psutil, pinned by start time."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1] / "telemetry"))
from drain_targets import start_target  # noqa: E402
from telemetry_fake_pynvml import GIB, FakeGpu, FakeNvml, assert_outcome_ok  # noqa: E402

from market_pipeline.hardware.nvml.adapter import NvmlAdapter  # noqa: E402
from market_pipeline.hardware.protocol import OutcomeStatus  # noqa: E402


def adapter_for(pid: int, proc_root: str = "/proc") -> NvmlAdapter:
    nvml = FakeNvml([FakeGpu("GPU-aaa", pids=[(pid, 8 * GIB)])])
    return NvmlAdapter(nvml=nvml, node_id="h200-a", gpm_interval_seconds=0, proc_root=proc_root)


def test_nvml_terminate_reaches_the_gpu_process_and_its_children(tmp_path):
    target = start_target(tmp_path, "--children", "3")
    try:
        adapter = adapter_for(target.pids[0])
        [task] = adapter.list_tasks()
        outcome = adapter.terminate_task(task.task_id, timeout_seconds=10)
        assert_outcome_ok(outcome)
        assert target.left() == []
        assert all(target.signals()[(pid, "SIGTERM")] == 1 for pid in target.pids)
    finally:
        target.cleanup()


def test_nvml_never_signals_a_recycled_pid(tmp_path):
    """NVML listed a pid whose process started at another time than the one running now
    (here: a /proc copy with an older start time): the running process is not touched."""
    target = start_target(tmp_path)
    try:
        pid = target.pids[0]
        fake = tmp_path / "proc"
        (fake / str(pid)).mkdir(parents=True)
        shutil.copy("/proc/stat", fake / "stat")
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)
        rest = fields[1].split()
        rest[19] = str(max(0, int(rest[19]) - 5000))  # started 50 s earlier than the live one
        (fake / str(pid) / "stat").write_text(fields[0] + ") " + " ".join(rest) + "\n")
        adapter = adapter_for(pid, proc_root=str(fake))
        [task] = adapter.list_tasks()
        outcome = adapter.terminate_task(task.task_id, timeout_seconds=1)
        assert outcome.status is OutcomeStatus.GONE, outcome
        assert target.left() == [pid] and not target.signals()
    finally:
        target.cleanup()


def test_nvml_refuses_to_signal_this_process():
    adapter = adapter_for(os.getpid())
    [task] = adapter.list_tasks()
    outcome = adapter.kill_task(task.task_id)
    assert outcome.status is OutcomeStatus.FAILED and "not signalled" in outcome.detail
