"""OS process probes for the `local-process` backend (psutil, plus /proc where psutil is silent).

A pid is identified together with its start time (clock ticks since boot in task ids,
psutil's create time elsewhere) so that a recycled pid is never mistaken for the task
that once had it.
"""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

import psutil

PROC = Path("/proc")


def has_proc() -> bool:
    return (PROC / "self" / "stat").exists()


def proc_start_ticks(pid: int) -> int | None:
    """Field 22 of /proc/<pid>/stat (start time in clock ticks); None if absent."""
    try:
        raw = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may contain spaces and parentheses: split after the last ')'.
    return int(raw[raw.rindex(")") + 2 :].split()[19])


def process_alive(pid: int) -> bool:
    """Alive and not a zombie."""
    try:
        return psutil.Process(pid).status() not in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD)
    except (psutil.NoSuchProcess, psutil.AccessDenied, OverflowError, ValueError):
        return False


def caught_signals(pid: int) -> set[int]:
    """Signals the process has a handler for (SigCgt of /proc/<pid>/status); empty when unknown."""
    try:
        text = (PROC / str(pid) / "status").read_text()
    except OSError:
        return set()
    for line in text.splitlines():
        if line.startswith("SigCgt:"):
            mask = int(line.split()[1], 16)
            return {bit + 1 for bit in range(64) if mask >> bit & 1}
    return set()


def proc_cmdline(pid: int) -> list[str]:
    try:
        return psutil.Process(pid).cmdline()
    except (psutil.NoSuchProcess, psutil.AccessDenied, OverflowError, ValueError):
        return []


def proc_started_at(pid: int) -> datetime | None:
    """Wall-clock start of a process."""
    try:
        return datetime.fromtimestamp(psutil.Process(pid).create_time(), timezone.utc)
    except (psutil.NoSuchProcess, psutil.AccessDenied, OverflowError, ValueError):
        return None
