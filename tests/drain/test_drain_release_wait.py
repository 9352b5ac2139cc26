"""Issue 40 item 7: a driver keeps listing an exited process for seconds (2.56 s on an
H200). The drain checks the GPU's release until a deadline, with backoff, and reports
`not_released` (with the reason) only when the pid is still listed past it.

The NVML here is a test double of the pynvml calls the nvml backend makes: it lists the
target's pid while the process runs and for `hold_seconds` after it is first seen gone."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import psutil
import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "telemetry"))
from drain_targets import start_target  # noqa: E402
from telemetry_fake_pynvml import GIB, FakeGpu, FakeNvml  # noqa: E402

from market_pipeline.drain.executor import DrainExecutor, DrainRequest  # noqa: E402
from market_pipeline.drain.protocol import InMemoryAuditStore  # noqa: E402
from market_pipeline.drain.steps import DrainTiming  # noqa: E402
from market_pipeline.hardware.nvml.adapter import NvmlAdapter  # noqa: E402


class LingeringNvml(FakeNvml):
    """Lists a process for `hold_seconds` after it exited, like a real driver does."""

    def __init__(self, gpus: list[FakeGpu], hold_seconds: float) -> None:
        super().__init__(gpus)
        self.hold_seconds = hold_seconds
        self.gone_at: dict[int, float] = {}
        self.dropped_at: dict[int, float] = {}

    def nvmlDeviceGetComputeRunningProcesses(self, handle):
        listed = []
        for proc in super().nvmlDeviceGetComputeRunningProcesses(handle):
            if not _runs(proc.pid):
                gone = self.gone_at.setdefault(proc.pid, time.monotonic())
                if time.monotonic() - gone >= self.hold_seconds:
                    self.dropped_at.setdefault(proc.pid, time.monotonic())
                    continue
            listed.append(proc)
        return listed


def _runs(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def timing(release_timeout: float) -> DrainTiming:
    return DrainTiming(
        warn_seconds=0.1,
        checkpoint_timeout_seconds=0.1,
        terminate_timeout_seconds=3.0,
        max_total_seconds=10.0,
        kill_timeout_seconds=3.0,
        verify_timeout_seconds=2.0,
        release_timeout_seconds=release_timeout,
        release_backoff_initial_seconds=0.05,
        release_backoff_max_seconds=0.5,
        call_margin_seconds=3.0,
        poll_seconds=0.05,
    )


def drain(tmp_path, hold_seconds: float, release_timeout: float):
    target = start_target(tmp_path)
    try:
        nvml = LingeringNvml([FakeGpu("GPU-h200", pids=[(target.pids[0], 8 * GIB)])], hold_seconds)
        adapter = NvmlAdapter(nvml=nvml, node_id="h200-a", gpm_interval_seconds=0)
        [task] = adapter.list_tasks()
        store = InMemoryAuditStore()
        executor = DrainExecutor(adapter, store, timing(release_timeout))
        report = executor.run(DrainRequest(drain_id="d-1", task=task))
        assert target.left() == []
        return report, store.load_states("d-1"), nvml
    finally:
        target.cleanup()


def test_release_waits_out_a_driver_that_lists_the_pid_for_3_seconds(tmp_path):
    report, history, nvml = drain(tmp_path, hold_seconds=3.0, release_timeout=10.0)
    assert report.outcome == "terminated" and report.final_state.value == "reported", report
    assert not report.platform_fault
    [released] = [row for row in history if row.state.value == "released"]
    # the pid was listed for the full 3 s after exit, and the drain waited for it
    assert released.detail["waited_seconds"] >= 2.9 and released.detail["attempts"] > 3
    assert nvml.dropped_at and min(nvml.dropped_at.values()) - min(nvml.gone_at.values()) >= 3.0


@pytest.mark.parametrize("release_timeout", [0.0, 0.6])
def test_release_past_its_deadline_is_not_released_with_the_reason(tmp_path, release_timeout):
    started = time.monotonic()
    report, history, _ = drain(tmp_path, hold_seconds=60.0, release_timeout=release_timeout)
    assert report.outcome == "failed" and report.platform_fault, report
    assert report.reason.startswith("not_released: ")
    assert "still running" in report.reason or "still in use" in report.reason
    assert f"release_timeout_seconds={release_timeout:g}" in report.reason
    assert time.monotonic() - started < 10  # the deadline bounds the wait


def test_release_settings_come_from_the_typed_config():
    from market_pipeline.config import load_config

    config = load_config(None)
    section = config.guardrails.task_drain.model_copy(
        update={"release_timeout_seconds": 7.5, "release_backoff_max_seconds": 1.5}
    )
    config = config.model_copy(
        update={"guardrails": config.guardrails.model_copy(update={"task_drain": section})}
    )
    timing_ = DrainTiming.from_config(config)
    assert (timing_.release_timeout_seconds, timing_.release_backoff_max_seconds) == (7.5, 1.5)
    # a drain persisted before the deadline (attempt counts) still resumes
    old = {**timing_.to_dict(), "verify_attempts": 3, "verify_retry_seconds": 0.2}
    for key in ("release_timeout_seconds", "release_backoff_initial_seconds", "release_backoff_max_seconds"):
        old.pop(key)
    assert (
        DrainTiming.from_dict(old).release_timeout_seconds == DrainTiming(1, 1, 1, 1).release_timeout_seconds
    )
