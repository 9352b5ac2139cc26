"""Issue 40 item 6: a drain killed inside its warning, whose task then exits and whose pid
is taken by another process, must not stay open for ever. The next `drain --pid` of that
pid sees by the recorded create time that the pid was reused, closes the old drain with
a reason saying so, and drains the new process on its own."""

from __future__ import annotations

import json
import os
import signal
import time

import pytest
from drain_targets import fork_cli, start_target
from test_drain_hardening import drain_argv

from market_pipeline.hardware.process_tree import CREATE_TIME_TOLERANCE


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("MARKET_PIPELINE_HOME", str(tmp_path))
    return tmp_path


def journals(home):
    return sorted((home / "var").rglob("*.journal.json"))


def test_a_drain_left_open_on_a_reused_pid_is_closed_with_its_reason(home, tmp_path):
    old = start_target(tmp_path)
    # the new process is born later than the create-time tolerance: a reused pid is a new process
    time.sleep(CREATE_TIME_TOLERANCE + 0.3)
    new = start_target(tmp_path)
    try:
        first = fork_cli(drain_argv(old.pids[0], "--audit", "memory", warn=30), tmp_path / "first.out")
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not (
            journals(home) and '"checkpointing"' in journals(home)[0].read_text()
        ):
            time.sleep(0.02)
        os.kill(first.pid, signal.SIGKILL)  # the drain dies inside the warning's notice
        first.join()
        [journal] = journals(home)
        payload = json.loads(journal.read_text())
        assert payload["rows"][-1]["state"] == "checkpointing" and payload["rows"][-1]["phase"] == "begin"
        assert payload["process"]["pid"] == old.pids[0]
        old.cleanup()  # the task's process exits ...
        # ... and its pid is given to another process (here: the journal and the registry
        # are made to say the old task had the new process's pid, with its own create time).
        reused = new.pids[0]
        payload["process"]["pid"] = reused
        for row in payload["rows"]:
            if "task" in row["detail"]:
                row["detail"]["task"]["pid"] = reused
        journal.write_text(json.dumps(payload))
        registry = home / "var" / "fleet_state.local_process.json"
        data = json.loads(registry.read_text())
        record = data["tasks"][payload["task_id"]]
        record["pid"] = reused
        record["members"] = [[reused, record["create_time"]]]
        registry.write_text(json.dumps(data))

        rerun = fork_cli(drain_argv(reused, "--audit", "memory", warn=0.3), tmp_path / "rerun.out")
        rerun.join(timeout=60)
        result = json.loads((tmp_path / "rerun.out").read_text().strip().splitlines()[-1])
        assert rerun.exitcode == 0 and result["outcome"] == "terminated", result
        assert result["task_id"] != payload["task_id"]  # the new process is its own task
        [closed] = result["closed_stale_drains"]
        assert closed["drain_id"] == payload["rows"][0]["drain_id"]
        assert closed["final_state"] == "reported" and closed["outcome"] == "gone", closed
        assert "pid_reused" in closed["reason"] and f"pid {reused} now belongs to another" in closed["reason"]
        assert journals(home) == []  # nothing left open
        received = new.signals()
        assert received[(reused, "SIGUSR1")] == 1 and received[(reused, "SIGTERM")] == 1
        assert new.left() == []
    finally:
        old.cleanup()
        new.cleanup()
