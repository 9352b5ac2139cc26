"""The shared bounded file lock: exclusive between holders, a named error past the wait, and
released on the way out (the twin's state and the local-process registry both use it)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from market_pipeline.file_lock import exclusive_lock
from market_pipeline.fleet.store import FileBlobs
from market_pipeline.hardware.local_process.registry import RegistryError, TaskRegistry


class HeldTooLong(Exception):
    pass


def test_core_file_lock_is_exclusive_and_bounded(tmp_path: Path) -> None:
    path = tmp_path / "deep" / "state.lock"
    with exclusive_lock(path, 1.0, HeldTooLong):
        started = time.monotonic()
        with pytest.raises(HeldTooLong):
            with exclusive_lock(path, 0.05, HeldTooLong, poll_seconds=0.01):
                pytest.fail("a second holder got the lock")
        assert time.monotonic() - started < 30  # bounded, not a hang
    with exclusive_lock(path, 0.05, HeldTooLong):  # released on exit
        pass


def test_core_file_lock_is_released_when_the_block_raises(tmp_path: Path) -> None:
    path = tmp_path / "state.lock"
    with pytest.raises(ZeroDivisionError):
        with exclusive_lock(path, 1.0, HeldTooLong):
            1 / 0
    with exclusive_lock(path, 0.05, HeldTooLong):
        pass


def test_core_file_lock_errors_name_the_twin_state_and_the_registry(tmp_path: Path) -> None:
    blobs = FileBlobs(tmp_path / "twin.json")
    with blobs.lock(1.0):
        with pytest.raises(TimeoutError, match=r"fleet state .*twin\.json stayed locked for 0\.05s"):
            with blobs.lock(0.05):
                pass
    registry = TaskRegistry(tmp_path / "registry.json", lock_timeout_seconds=0.05)
    with registry.edit() as data:
        data["cordoned"].append("n1")
        with pytest.raises(RegistryError, match=r"registry lock .*registry\.json\.lock held for over 0\.05s"):
            with registry.edit():
                pass
    assert registry.read()["cordoned"] == ["n1"]
