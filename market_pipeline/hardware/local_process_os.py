"""OS process probes for the `local-process` backend (Linux /proc, with a POSIX fallback).

A pid is identified together with its start time (clock ticks since boot) so that a
recycled pid is never mistaken for the task that once had it.
"""

from __future__ import annotations

import os
import signal
from datetime import datetime, timedelta, timezone
from pathlib import Path

PROC = Path("/proc")


def _stat_fields(pid: int) -> list[str] | None:
    """Fields of /proc/<pid>/stat from field 3 (state) on; None if the process is absent."""
    try:
        raw = (PROC / str(pid) / "stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    except OSError:
        return None
    # The command name (field 2) may contain spaces and parentheses: split after the last ')'.
    return raw[raw.rindex(")") + 2:].split()


def has_proc() -> bool:
    return (PROC / "self" / "stat").exists()


def proc_state(pid: int) -> str | None:
    fields = _stat_fields(pid)
    return fields[0] if fields else None


def proc_start_ticks(pid: int) -> int | None:
    fields = _stat_fields(pid)
    return int(fields[19]) if fields else None  # field 22: starttime


def process_alive(pid: int, start_ticks: int | None = None) -> bool:
    """Alive and not a zombie; with start_ticks, also the same process as before."""
    if pid <= 0:
        return False
    if not has_proc():
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    fields = _stat_fields(pid)
    if fields is None or fields[0] in ("Z", "X", "x"):
        return False
    return start_ticks is None or int(fields[19]) == start_ticks


def caught_signals(pid: int) -> set[int]:
    """Signals the process has a handler for (SigCgt); empty when unknown."""
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
        raw = (PROC / str(pid) / "cmdline").read_bytes()
    except OSError:
        return []
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


def proc_started_at(pid: int) -> datetime | None:
    """Wall-clock start of a process from its start ticks and the boot time."""
    ticks = proc_start_ticks(pid)
    if ticks is None:
        return None
    try:
        stat = (PROC / "stat").read_text()
        boot = next(int(line.split()[1]) for line in stat.splitlines() if line.startswith("btime"))
    except (OSError, StopIteration, ValueError):
        return None
    seconds = ticks / os.sysconf("SC_CLK_TCK")
    return datetime.fromtimestamp(boot, timezone.utc) + timedelta(seconds=seconds)


def send_signal(pid: int, sig: signal.Signals) -> str | None:
    """Send a signal; None on success, otherwise why it could not be sent."""
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        return "no such process"
    except PermissionError as exc:
        return f"not permitted: {exc}"
    return None
