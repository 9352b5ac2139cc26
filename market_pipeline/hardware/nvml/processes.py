"""Who a GPU process is: task and tenant ids from /proc, for the nvml backend.

A workload launched by the platform carries MARKET_TASK_ID and MARKET_TENANT_ID in its
environment; /proc/<pid>/environ is readable by the same user (or root). Otherwise the
task is "pid-<pid>" and the tenant is the process owner's user name.
"""

from __future__ import annotations

import os
import pwd
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path

TASK_ENV = "MARKET_TASK_ID"
TENANT_ENV = "MARKET_TENANT_ID"


@dataclass(frozen=True)
class ProcessIdentity:
    pid: int
    task_id: str
    tenant_id: str
    started_at: datetime | None
    command: str


def identify_process(pid: int, proc_root: str = "/proc") -> ProcessIdentity:
    base = Path(proc_root) / str(pid)
    environ = _environ(base)
    owner = _owner(base)
    return ProcessIdentity(
        pid=pid,
        task_id=environ.get(TASK_ENV) or f"pid-{pid}",
        tenant_id=environ.get(TENANT_ENV) or owner,
        started_at=_started_at(base, proc_root),
        command=_read_text(base / "comm").strip(),
    )


def _read_text(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def _environ(base: Path) -> dict[str, str]:
    try:
        raw = (base / "environ").read_bytes()
    except OSError:  # another user's process, or gone
        return {}
    pairs = (item.split(b"=", 1) for item in raw.split(b"\0") if b"=" in item)
    return {k.decode(errors="replace"): v.decode(errors="replace") for k, v in pairs}


def _owner(base: Path) -> str:
    try:
        uid = base.stat().st_uid
    except OSError:
        return "unknown"
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid-{uid}"


def _started_at(base: Path, proc_root: str) -> datetime | None:
    """Start time from /proc/<pid>/stat (ticks since boot) and the boot time in /proc/stat."""
    stat = _read_text(base / "stat")
    boot = next(
        (
            line.split()[1]
            for line in _read_text(Path(proc_root) / "stat").splitlines()
            if line.startswith("btime ")
        ),
        None,
    )
    if not stat or boot is None or ")" not in stat:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    try:
        ticks = int(fields[19])  # field 22 of stat; fields here start at field 3
        ticks_per_second = os.sysconf("SC_CLK_TCK")
        return datetime.fromtimestamp(int(boot), tz=timezone.utc) + timedelta(
            seconds=ticks / ticks_per_second
        )
    except (IndexError, ValueError, OSError):
        return None
