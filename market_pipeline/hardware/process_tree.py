"""A task's whole process tree, found, signalled and waited for through psutil.

A task is its root process plus everything it started: all its descendants (children,
grandchildren, ...), every process seen as a member before (it stays one after its parent
died and it was re-parented), and, when the root leads its own process group or session
(as a launched worker does), every process in that group or session, which also finds
children re-parented to PID 1 after a double fork. A root that leads neither (a process
started from a shell script or a test) is reached through its descendants alone.
Each process is pinned by its create time, so a recycled pid is never taken for a member.
PID 1, kernel threads, this process and its ancestors are never targets or members.

`signal_and_wait` is how both process backends end a task: it freezes the tree first
(SIGSTOP to every member, re-scanned until no new member appears: a stopped process cannot
fork), sends the signal to the frozen tree, lets it run again (SIGCONT), then re-scans until
every process is gone or the time is up. Processes born while the task winds down whose
parent died at once (re-parented out of the task's session) are found by their group and
session, and signalled too.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import psutil

PF_KTHREAD = 0x00200000  # include/linux/sched.h: the task is a kernel thread
KTHREADD_PID = 2


def kernel_thread(pid: int) -> bool:
    """Whether `pid` is a kernel thread (kthreadd or one of its children): the flags field
    (9) of <procfs>/<pid>/stat carries PF_KTHREAD. The procfs is the one psutil reads
    (`psutil.PROCFS_PATH`: an agent in a container may point it at the host's), so the
    answer is about the process psutil would list and signal. Without that file (no such
    process, or no procfs, where psutil cannot read a process either) only pid 2, kthreadd."""
    try:
        raw = (Path(psutil.PROCFS_PATH) / str(pid) / "stat").read_text()
        return bool(int(raw[raw.rindex(")") + 2 :].split()[6]) & PF_KTHREAD)
    except OSError:
        return pid == KTHREADD_PID
    except (ValueError, IndexError):
        return False


def proc_name(pid: int) -> str:
    try:
        return psutil.Process(pid).name()
    except (psutil.NoSuchProcess, psutil.AccessDenied, OverflowError, ValueError):
        return "unknown"


CREATE_TIME_TOLERANCE = 0.05  # seconds; psutil derives it from clock ticks (1/100 s)
FREEZE_ROUNDS = 20  # re-scans while freezing a tree; each finds the children of the last round
Member = tuple[int, float]  # (pid, create time)


class NoSuchProcessError(ValueError):
    """The pid names no running process; says which."""


class ProtectedProcessError(ValueError):
    """The pid is PID 1, a kernel thread, this process or one of its ancestors; says which."""


def protected_pids() -> frozenset[int]:
    """PID 1, this process and its ancestors: never a drain's target."""
    me = psutil.Process()
    return frozenset({1, me.pid, *(p.pid for p in me.parents())})


def refusal(pid: int) -> str | None:
    """Why `pid` must never be drained (PID 1, a kernel thread, this command or one of
    its ancestors), or None."""
    if pid in protected_pids():
        return f"pid {pid} is PID 1, this command or one of its ancestors: refusing to drain it"
    if kernel_thread(pid):
        return f"pid {pid} is a kernel thread ({proc_name(pid)}): refusing to drain it"
    return None


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
    reason = refusal(pid)
    if reason:
        raise ProtectedProcessError(reason)
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
    """The live members of one task, as found now (each with its create time)."""

    members: tuple[psutil.Process, ...]
    created: dict[int, float] = field(default_factory=dict, compare=False)

    @property
    def alive(self) -> bool:
        return any(_same(p, self.created.get(p.pid)) for p in self.members)

    def refs(self) -> list[Member]:
        refs = []
        for p in self.members:
            if p.pid in self.created:
                refs.append((p.pid, self.created[p.pid]))
                continue
            try:
                refs.append((p.pid, p.create_time()))
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
        return sorted(refs)


@dataclass(frozen=True)
class Newcomers:
    """How to recognise a process born during a drain whose parent (a member) died at once:
    it was not in the process table when the drain began, it is in the group and session
    of a member, and its parent is PID 1 or outside that session (where re-parenting puts
    an orphan; a process started by the shell that shares the task's group has its
    parent inside the session). With `created` (each of those pids' create time then), a
    pid that was in the table but now names a process with another create time is born
    since too: the kernel reuses pids, and on a busy host (32,768 pids by default) an orphan
    can get one that a process held when the drain began.

    The rule cannot tell the task's orphan from another job's where the root leads neither
    its group nor its session and other jobs share both (jobs started in the background by
    one script, with no job control): an orphan such a job double-forks during the drain is
    taken as the task's. The local-process backend launches each task in a session of its
    own, where the group and session are the task's alone."""

    before: frozenset[int]  # pids in the process table when the drain began
    groups: frozenset[tuple[int, int]]  # (pgid, sid) of the task's members
    created: dict[int, float] | None = field(default=None, compare=False)  # None: pids alone tell

    @classmethod
    def now(cls) -> "Newcomers":
        """The process table as a drain begins: its pids and their create times."""
        created = {}
        for proc in psutil.process_iter(["create_time"]):
            if proc.info["create_time"] is not None:
                created[proc.pid] = float(proc.info["create_time"])
        return cls(frozenset(created), frozenset(), created)


def _descendants(proc: psutil.Process) -> list[psutil.Process]:
    """Every process below `proc`: children, grandchildren and so on."""
    try:
        return proc.children(recursive=True)
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return []


def task_tree(
    root_pid: int,
    root_create_time: float | None,
    known: Iterable[Sequence[float]] = (),
    newcomers: Newcomers | None = None,
) -> ProcessTree:
    """Every live process of the task rooted at (root_pid, root_create_time).

    `known` are members seen before (pid, create time): they stay members while they run,
    even once their parent has died and nothing links them to the root any more; their
    descendants are members too. `newcomers` (during a drain) also finds orphans born
    since the drain began (see Newcomers)."""
    protected = protected_pids()
    found: dict[int, psutil.Process] = {}
    created: dict[int, float] = {}

    def add(proc: psutil.Process, expected: float | None = None) -> bool:
        if proc.pid in protected or proc.pid in found or not _same(proc, expected):
            return False
        try:
            created[proc.pid] = proc.create_time()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            return False
        if kernel_thread(proc.pid):
            return False
        found[proc.pid] = proc
        return True

    try:
        root = psutil.Process(root_pid)
        root_live = _same(root, root_create_time)
    except (psutil.NoSuchProcess, OverflowError, ValueError):
        root, root_live = None, False
    tops: list[psutil.Process] = []
    if root is not None and root_live and add(root):
        tops.append(root)
    for pid, expected in known:
        try:
            proc = psutil.Process(int(pid))
        except (psutil.NoSuchProcess, OverflowError, ValueError):
            continue
        if add(proc, float(expected)):
            tops.append(proc)
    covered: set[int] = set()  # each listing of descendants reads the whole process table
    for top in tops:
        if top.pid in covered:
            continue
        for child in _descendants(top):
            covered.add(child.pid)
            add(child)
    # A group or session led by the root: the kernel does not hand its id out as a new pid
    # while any member lives, so while the root or a known member is in it, all its members
    # are the task's (also those the root's death re-parented to PID 1). Skipped as a whole
    # when this command or an ancestor is in it: then it is not the task's alone.
    if root_live or any(root_pid in _group_and_session(pid) for pid in found):
        for proc in _members_led_by(root_pid, protected):
            add(proc)
    if newcomers is not None:
        for proc in _orphans_born_since(newcomers, found):
            add(proc)
    return ProcessTree(tuple(found.values()), created)


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


def _orphans_born_since(spec: Newcomers, found: dict[int, psutil.Process]) -> list[psutil.Process]:
    orphans = []
    pids = set(psutil.pids()) - found.keys()
    if spec.created is None:
        pids -= spec.before  # the few born since
    for pid in pids:
        ids = _group_and_session(pid)
        if ids not in spec.groups:
            continue
        try:
            proc = psutil.Process(pid)
            then = spec.created.get(pid) if spec.created is not None else None
            if then is not None and abs(proc.create_time() - then) <= CREATE_TIME_TOLERANCE:
                continue  # there when the drain began, not a reused pid
            parent = proc.ppid()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        if parent == 1 or _group_and_session(parent)[1] != ids[1]:
            orphans.append(proc)
    return orphans


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
            ref = (proc.pid, tree.created.get(proc.pid) or proc.create_time())
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


@dataclass(frozen=True)
class TreeWait:
    """What `signal_and_wait` did: who got the signal, who is left, who was ever seen."""

    sent: frozenset[Member]
    problems: tuple[str, ...]
    left: tuple[Member, ...]  # processes of the task still running at the end; () = all gone
    seen: tuple[Member, ...]  # every member seen (to remember with the task)
    seconds: float

    @property
    def gone(self) -> bool:
        return not self.left


def signal_and_wait(
    root_pid: int,
    root_create_time: float | None,
    known: Iterable[Sequence[float]],
    sig: signal.Signals,
    timeout_seconds: float,
    poll_seconds: float = 0.05,
) -> TreeWait:
    """`sig` once to every process of the task (the frozen tree, then any member found
    later), then wait until none of them runs or `timeout_seconds` pass. Never raises for
    a process that vanishes or refuses: that is in the result."""
    started = time.monotonic()
    deadline = started + timeout_seconds
    seen: dict[int, float] = {int(p): float(c) for p, c in known}
    spec = Newcomers.now()

    def scan() -> ProcessTree:
        nonlocal spec
        tree = task_tree(root_pid, root_create_time, seen.items(), spec)
        seen.update(tree.created)
        groups = {_group_and_session(p.pid) for p in tree.members}
        spec = Newcomers(spec.before, spec.groups | {g for g in groups if None not in g}, spec.created)
        return tree

    sent: set[Member] = set()
    problems: list[str] = []
    stopped: list[psutil.Process] = []
    try:
        tree = _freeze(scan, stopped, problems)
        new, trouble = signal_tree(tree, sig, sent)
        sent |= new
        problems += trouble
    finally:
        for proc in stopped:
            try:
                proc.resume()  # SIGCONT: a stopped process cannot act on its SIGTERM
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
    while True:
        tree = scan()
        if not tree.alive:
            left: list[Member] = []
            break
        new, trouble = signal_tree(tree, sig, sent)
        sent |= new
        problems += trouble
        if time.monotonic() >= deadline:
            left = [ref for ref in tree.refs() if running(*ref)]
            if left:
                break
        time.sleep(poll_seconds)
    return TreeWait(
        frozenset(sent),
        tuple(dict.fromkeys(problems)),
        tuple(left),
        tuple(sorted(seen.items())),
        time.monotonic() - started,
    )


def _freeze(scan, stopped: list[psutil.Process], problems: list[str]) -> ProcessTree:
    """Stop every member (SIGSTOP), re-scanning until a scan finds no new one: then the
    tree can no longer grow, and one signal reaches all of it. Appends to `stopped`."""
    frozen: set[int] = set()
    tree = scan()
    for _ in range(FREEZE_ROUNDS):
        fresh = [p for p in tree.members if p.pid not in frozen]
        if not fresh:
            break
        for proc in fresh:
            frozen.add(proc.pid)
            try:
                proc.suspend()
                stopped.append(proc)
            except psutil.NoSuchProcess:
                continue
            except psutil.AccessDenied as exc:
                problems.append(f"pid {proc.pid}: not permitted ({exc})")
        tree = scan()
    return tree


def tree_cpu_seconds(pid: int) -> float:
    """CPU seconds (user and system) that a process and its live descendants have used, with
    what each has reaped from its ended children; 0.0 once the process is gone. The difference
    of two readings is what the tree spent between them, short-lived children included once
    their parent has waited for them."""
    try:
        root = psutil.Process(pid)
        members = [root, *root.children(recursive=True)]
    except psutil.Error:
        return 0.0
    total = 0.0
    for member in members:
        try:
            times = member.cpu_times()
        except psutil.Error:
            continue  # ended between the listing and the reading
        total += times.user + times.system + times.children_user + times.children_system
    return total


def server_cpu_seconds(name: str) -> float:
    """CPU seconds of every process tree whose root is named `name` and whose parent is not (a
    server with its workers: PostgreSQL's postmaster with its backends, RabbitMQ's beam.smp),
    as `tree_cpu_seconds` counts them; 0.0 when none runs."""
    total = 0.0
    for proc in psutil.process_iter(["name", "ppid"]):
        if proc.info["name"] != name:
            continue
        try:
            parent = psutil.Process(proc.info["ppid"]).name() if proc.info["ppid"] else ""
        except psutil.Error:
            parent = ""
        if parent != name:
            total += tree_cpu_seconds(proc.pid)
    return total
