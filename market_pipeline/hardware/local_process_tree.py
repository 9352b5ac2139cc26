"""A task's whole process tree, found and signalled through psutil.

A task is its root process plus everything it started: its descendants, and, when the root
leads its own process group or session (as a launched worker does), every process in that
group or session, which also finds children re-parented to PID 1 after a double fork.
Each process is pinned by its create time, so a recycled pid is never taken for a member.
PID 1, this process and its ancestors are never members and never signalled.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import psutil

CREATE_TIME_TOLERANCE = 0.05  # seconds; psutil derives it from clock ticks (1/100 s)
Member = tuple[int, float]  # (pid, create time)


class NoSuchProcessError(ValueError):
    """The pid names no running process; says which."""


class ProtectedProcessError(ValueError):
    """The pid is PID 1, this process or one of its ancestors; says which."""


def protected_pids() -> frozenset[int]:
    """PID 1, this process and its ancestors: never a drain's target."""
    me = psutil.Process()
    return frozenset({1, me.pid, *(p.pid for p in me.parents())})


def _same(proc: psutil.Process, create_time: float | None) -> bool:
    """Running (not a zombie) and, given a create time, the very process we knew."""
    try:
        if proc.status() in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD):
            return False
        return create_time is None or abs(proc.create_time() - create_time) <= CREATE_TIME_TOLERANCE
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return False


def open_process(pid: int) -> psutil.Process:
    """The live process `pid`; NoSuchProcessError or ProtectedProcessError otherwise."""
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        raise NoSuchProcessError(f"pid must be a positive integer, got {pid!r}")
    if pid in protected_pids():
        raise ProtectedProcessError(
            f"pid {pid} is PID 1, this command or one of its ancestors: refusing to drain it"
        )
    try:
        proc = psutil.Process(pid)
    except (psutil.NoSuchProcess, OverflowError, ValueError):
        raise NoSuchProcessError(f"no process with pid {pid}") from None
    if not _same(proc, None):
        raise NoSuchProcessError(f"no process with pid {pid} (it has exited)")
    return proc


def running(pid: int, created: float | None) -> bool:
    """The process (pid, create time) runs: one cheap probe, no scan of the process table."""
    try:
        return _same(psutil.Process(pid), created)
    except (psutil.NoSuchProcess, OverflowError, ValueError):
        return False


def create_time(pid: int) -> float | None:
    try:
        return psutil.Process(pid).create_time()
    except (psutil.NoSuchProcess, psutil.AccessDenied, OverflowError, ValueError):
        return None


def _group_and_session(pid: int) -> tuple[int | None, int | None]:
    try:
        return os.getpgid(pid), os.getsid(pid)
    except (ProcessLookupError, PermissionError, OverflowError):
        return None, None


@dataclass(frozen=True)
class ProcessTree:
    """The live members of one task, as found now."""

    members: tuple[psutil.Process, ...]

    @property
    def alive(self) -> bool:
        return any(_same(p, None) for p in self.members)

    def refs(self) -> list[Member]:
        refs = []
        for p in self.members:
            try:
                refs.append((p.pid, p.create_time()))
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
        return sorted(refs)


def task_tree(
    root_pid: int, root_create_time: float | None, known: Iterable[Sequence[float]] = ()
) -> ProcessTree:
    """Every live process of the task rooted at (root_pid, root_create_time).

    `known` are members seen before (pid, create time): they stay members while they run,
    even once their parent has died and nothing links them to the root any more."""
    protected = protected_pids()
    found: dict[int, psutil.Process] = {}

    def add(proc: psutil.Process, expected: float | None = None) -> None:
        if proc.pid not in protected and proc.pid not in found and _same(proc, expected):
            found[proc.pid] = proc

    try:
        root = psutil.Process(root_pid)
        root_live = _same(root, root_create_time)
    except (psutil.NoSuchProcess, OverflowError, ValueError):
        root, root_live = None, False
    if root is not None and root_live:
        add(root)
        try:
            for child in root.children(recursive=True):
                add(child)
        except psutil.NoSuchProcess:
            pass
    for pid, created in known:
        try:
            add(psutil.Process(int(pid)), float(created))
        except (psutil.NoSuchProcess, OverflowError, ValueError):
            continue
    # A group or session led by the root: the kernel does not hand its id out as a new pid
    # while any member lives, so while the root or a known member is in it, all its members
    # are the task's (also those the root's death re-parented to PID 1). Skipped as a whole
    # when this command or an ancestor is in it: then it is not the task's alone.
    if root_live or any(root_pid in _group_and_session(pid) for pid in found):
        for proc in _members_led_by(root_pid, protected):
            add(proc)
    return ProcessTree(tuple(found.values()))


def _members_led_by(leader: int, protected: frozenset[int]) -> list[psutil.Process]:
    """Processes whose group or session id is `leader`; none if a protected one is among them."""
    members = []
    for proc in psutil.process_iter():
        pgid, sid = _group_and_session(proc.pid)
        if leader in (pgid, sid):
            if proc.pid in protected:
                return []
            members.append(proc)
    return members


def signal_tree(
    tree: ProcessTree, sig: signal.Signals, already: set[Member] | None = None
) -> tuple[set[Member], list[str]]:
    """Send `sig` once to every member not in `already`; (members signalled, problems).

    psutil refuses to signal a pid whose create time changed (pid reuse)."""
    sent: set[Member] = set()
    problems: list[str] = []
    already = already or set()
    for proc in tree.members:
        try:
            ref = (proc.pid, proc.create_time())
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        if any(p == ref[0] and abs(c - ref[1]) <= CREATE_TIME_TOLERANCE for p, c in already):
            continue
        try:
            proc.send_signal(sig)
            sent.add(ref)
        except psutil.NoSuchProcess:
            continue  # exited (or its pid was reused) since the scan: nothing to signal
        except psutil.AccessDenied as exc:
            problems.append(f"pid {proc.pid}: not permitted ({exc})")
    return sent, problems
