"""Issue 40's drain reach, each as a test: a drain ends every process of the task (also
grandchildren of a root that leads no group or session, and a process born while the root
exits), and never signals a kernel thread. Also what a drain meets in the field (an
unprivileged agent, a container whose PID 1 leads the session, a subreaper, members that
vanish mid-drain), and the CPU seconds of a process tree (`bench scale` counts with them)."""

from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest
from drain_targets import cli, start_target
from test_drain_hardening import drain_argv, nothing_written

from market_pipeline.hardware.process_tree import (
    Newcomers,
    NoSuchProcessError,
    ProcessTree,
    ProtectedProcessError,
    create_time,
    kernel_thread,
    open_process,
    proc_name,
    refusal,
    running,
    server_cpu_seconds,
    signal_and_wait,
    signal_tree,
    task_tree,
    tree_cpu_seconds,
)


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("MARKET_PIPELINE_HOME", str(tmp_path))
    return tmp_path


def test_drain_reaches_grandchildren_of_a_root_that_leads_no_group(home, tmp_path, capsys):
    """The root shares this test's process group and session (as a process started from a
    shell script does), and each of its children started a grandchild: only the
    descendants, followed all the way down, lead to the grandchildren."""
    target = start_target(tmp_path, "--children", "2", "--grandchildren")
    try:
        root = target.pids[0]
        assert root not in (os.getpgid(root), os.getsid(root))
        assert len(target.pids) == 5  # root, 2 children, 2 grandchildren
        rc = cli(drain_argv(root, "--audit", "memory", warn=0.3, grace=2.0))
        result = json.loads(capsys.readouterr().out)
        assert rc == 0 and result["outcome"] == "terminated", result
        assert "released" in result["states"]
        assert target.left() == []
        received = target.signals()
        assert all(received[(pid, "SIGTERM")] == 1 for pid in target.pids), received
    finally:
        target.cleanup()


def test_drain_reaches_a_process_born_while_the_root_exits(home, tmp_path, capsys):
    """The root's SIGTERM handler starts a process and exits at once: that process is
    re-parented before any re-scan can find it below the root. It is the task's all the
    same, gets SIGTERM, and the drain is released only once it is gone."""
    target = start_target(tmp_path, "--fork-on-term")
    try:
        root = target.pids[0]
        rc = cli(drain_argv(root, "--audit", "memory", warn=0.3, grace=2.0))
        result = json.loads(capsys.readouterr().out)
        # "killed" when the SIGTERM reached the new process before Python's fork hook in it
        # (which drops a signal caught that early): then the SIGKILL after the grace ends it.
        assert rc == 0 and result["outcome"] in ("terminated", "killed"), result
        assert "released" in result["states"]
        spawned = target.spawned()
        assert len(spawned) == 1
        assert target.left() == [], f"still running: {target.left()}"
    finally:
        target.cleanup()


@pytest.mark.skipif(not kernel_thread(2), reason="pid 2 is no kernel thread here")
def test_drain_refuses_a_kernel_thread(home, capsys):
    for pid in (2, *[p for p in range(3, 64) if kernel_thread(p)][:2]):
        rc = cli(drain_argv(pid))
        captured = capsys.readouterr()
        assert rc == 2 and captured.out == "", pid
        assert captured.err.startswith("error: ") and captured.err.count("\n") == 1, captured.err
        assert f"pid {pid} is a kernel thread" in captured.err and "refusing to drain it" in captured.err
    assert nothing_written(home)


@pytest.mark.skipif(not kernel_thread(2), reason="pid 2 is no kernel thread here")
def test_nvml_backend_never_signals_a_kernel_thread():
    from test_drain_nvml import adapter_for

    from market_pipeline.hardware.protocol import OutcomeStatus

    adapter = adapter_for(2)
    [task] = adapter.list_tasks()
    outcome = adapter.kill_task(task.task_id)
    assert outcome.status is OutcomeStatus.FAILED
    assert "kernel thread" in outcome.detail and "not signalled" in outcome.detail


@pytest.mark.parametrize("flags", [(), ("--storm-setsid",)], ids=["same-session", "own-sessions"])
def test_drain_of_a_root_that_keeps_forking_leaves_nothing(home, tmp_path, capsys, flags):
    """From its warning on, the root starts a child every millisecond, and it dies at once
    on SIGTERM: a child born after the tree was read and before the root died is
    re-parented at once. The tree is frozen before the signal (a stopped process cannot
    fork), so none escapes, also when each child starts a session of its own at once
    (then only the tree, read while frozen, links it to the task)."""
    target = start_target(tmp_path, "--storm", "2000", *flags)
    try:
        rc = cli(drain_argv(target.pids[0], "--audit", "memory", warn=0.2, grace=3.0))
        result = json.loads(capsys.readouterr().out)
        assert rc == 0 and result["outcome"] in ("terminated", "killed"), result
        assert 10 <= len(target.spawned()) < 2000  # the storm was still going when drained
        assert target.left() == [], f"{len(target.left())} still running"
    finally:
        target.cleanup()


def _pids(tree) -> list[int]:
    return sorted(p.pid for p in tree.members)


def test_the_tree_of_a_root_that_leads_no_group_is_its_descendants_all_the_way_down(tmp_path):
    """The root shares this test's group and session, and its child started a grandchild:
    the task is those three (followed through the child), never this test or its shell,
    which share the root's group; a root whose create time is not the one known is another
    process (a reused pid): no task at all."""
    target = start_target(tmp_path, "--children", "1", "--grandchildren")
    try:
        root = target.pids[0]
        (child,) = (pid for pid in target.pids[1:] if psutil.Process(pid).ppid() == root)
        (grandchild,) = (pid for pid in target.pids[1:] if psutil.Process(pid).ppid() == child)
        assert root not in (os.getpgid(root), os.getsid(root))
        assert os.getpgid(root) == os.getpgid(os.getpid())
        tree = task_tree(root, target.created[root])
        assert _pids(tree) == sorted([root, child, grandchild])
        assert os.getpid() not in _pids(tree) and os.getppid() not in _pids(tree)
        assert [pid for pid, _ in tree.refs()] == sorted([root, child, grandchild])
        assert tree.alive
        assert task_tree(root, target.created[root] + 10.0).members == ()
        # members known from before stay the task's (with their descendants) when nothing
        # leads to them from the root any more: here the root is taken for another process
        known = [(child, target.created[child])]
        assert _pids(task_tree(root, target.created[root] + 10.0, known)) == sorted([child, grandchild])
        assert (
            task_tree(root, target.created[root] + 10.0, [(child, target.created[child] + 10.0)]).members
            == ()
        )
    finally:
        target.cleanup()


def test_the_tree_of_a_root_that_leads_its_session_holds_its_orphans(tmp_path):
    """A root that leads its own session (a launched worker): a double-forked orphan,
    re-parented to PID 1 at once, is found through the session it stayed in; and only
    the processes of that session (not this test, in another one)."""
    target = start_target(tmp_path, "--setsid", "--children", "1", "--grandchildren", "--orphans", "1")
    try:
        root = target.pids[0]
        assert os.getsid(root) == root
        orphans = [pid for pid in target.pids[1:] if psutil.Process(pid).ppid() not in target.pids]
        assert len(orphans) == 1  # re-parented: not a descendant of the root any more
        tree = task_tree(root, target.created[root])
        assert _pids(tree) == sorted(target.pids)
        assert os.getpid() not in _pids(tree)
    finally:
        target.cleanup()


def test_members_known_from_before_each_bring_their_descendants(tmp_path):
    """Root taken for another process (a reused pid), members known from before: a child,
    its grandchild, the other child. Each known member's descendants are the task's, also
    after one known member turned out to sit under another."""
    target = start_target(tmp_path, "--children", "2", "--grandchildren")
    try:
        root = target.pids[0]
        first, second = sorted(pid for pid in target.pids[1:] if psutil.Process(pid).ppid() == root)
        (under_first,) = (pid for pid in target.pids if psutil.Process(pid).ppid() == first)
        known = [(pid, target.created[pid]) for pid in (first, under_first, second)]
        tree = task_tree(root, target.created[root] + 10.0, known)
        assert _pids(tree) == sorted(target.pids[1:])  # the second child's grandchild included
    finally:
        target.cleanup()


def test_a_session_whose_leader_died_still_holds_the_orphans_in_it(tmp_path):
    """The session leader is gone; a member known from before still lives in its session, and
    so does a double-forked orphan nothing links to any member: both are the task's. With no
    member known, the gone root's session is not taken as the task's."""

    target = start_target(tmp_path, "--setsid", "--children", "1", "--orphans", "1")
    try:
        root = target.pids[0]
        (child,) = (pid for pid in target.pids if psutil.Process(pid).ppid() == root)
        (orphan,) = (pid for pid in target.pids[1:] if psutil.Process(pid).ppid() not in target.pids)
        os.kill(root, signal.SIGKILL)
        target.proc.wait(timeout=10)
        tree = task_tree(root, target.created[root], [(child, target.created[child])])
        assert _pids(tree) == sorted([child, orphan])
        # with nothing known, the session of a root that is gone is not searched: no live
        # member of the task proves the session is this task's
        assert task_tree(root, target.created[root]).members == ()
    finally:
        target.cleanup()


def _orphan_born_during_a_drain(tmp_path) -> dict:
    """Outsiders (sessions of their own) are born after the drain began, then a root that
    shares this process's group and session and double-forks an orphan, then a sibling this
    process starts in that group and session. What the task's tree holds, with and without
    the drain's newcomers."""
    start = Newcomers.now()  # the process table as the drain began: pids and create times
    outsiders = [subprocess.Popen(["sleep", "60"], start_new_session=True) for _ in range(24)]
    target = start_target(tmp_path, "--orphans", "1")
    sibling = subprocess.Popen(["sleep", "60"])
    try:
        root = target.pids[0]
        (orphan,) = target.pids[1:]
        ids = (os.getpgid(root), os.getsid(root))
        return {
            "root": root,
            "orphan": orphan,
            "orphan_parent": psutil.Process(orphan).ppid(),
            "root_leads": root in ids,
            "pid_1_in_the_session": os.getsid(1) == ids[1],
            "root_is_a_kernel_thread": kernel_thread(root),
            "root_refused": refusal(root),
            "without_newcomers": _pids(task_tree(root, target.created[root])),
            "with_newcomers": _pids(
                task_tree(
                    root, target.created[root], (), Newcomers(start.before, frozenset({ids}), start.created)
                )
            ),
            # the orphan under a pid a process held when the drain began (the kernel reuses
            # pids): with the create times it is still born since; by pids alone it is not
            "reused_pid": _pids(
                task_tree(
                    root,
                    target.created[root],
                    (),
                    Newcomers(
                        start.before | {orphan},
                        frozenset({ids}),
                        {**start.created, orphan: target.created[orphan] - 60.0},
                    ),
                )
            ),
            "reused_pid_by_pids_alone": _pids(
                task_tree(
                    root, target.created[root], (), Newcomers(start.before | {orphan}, frozenset({ids}))
                )
            ),
        }
    finally:
        for proc in (sibling, *outsiders):
            proc.kill()
            proc.wait()
        target.cleanup()


CLONE_NEWNS, CLONE_NEWPID, MS_REC, MS_PRIVATE = 0x00020000, 0x20000000, 0x4000, 0x40000


def _in_a_container(scenario, *args) -> dict:
    """`scenario(*args)` run as pid 2 of a new pid namespace (with its own /proc), whose PID 1
    leads the session everything in it runs in and reaps orphans, as a container's init does.
    Its result as JSON; {"unavailable": reason} where this host allows no pid namespace."""
    libc = ctypes.CDLL(None, use_errno=True)
    read, write = os.pipe()
    outer = os.fork()
    if outer == 0:  # pragma: no cover - runs in the fork
        os.close(read)
        try:
            if libc.unshare(CLONE_NEWPID | CLONE_NEWNS) or libc.mount(
                b"none", b"/", None, MS_REC | MS_PRIVATE, None
            ):
                raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
            init = os.fork()
            if init == 0:
                libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: gone with the outer fork
                if libc.mount(b"proc", b"/proc", b"proc", 0, None):
                    raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
                os.setsid()
                inner = os.fork()
                if inner == 0:
                    try:
                        os.write(write, json.dumps(scenario(*args)).encode())
                    except BaseException as exc:
                        os.write(write, json.dumps({"failed": repr(exc)}).encode())
                    os._exit(0)
                os.close(write)
                while os.waitpid(-1, 0)[0] != inner:  # PID 1 reaps whatever is re-parented to it
                    pass
                os._exit(0)  # the kernel ends every process left in the namespace
            os.close(write)
            os.waitpid(init, 0)
        except OSError as exc:
            os.write(write, json.dumps({"unavailable": str(exc)}).encode())
        os._exit(0)
    os.close(write)
    chunks = []
    while chunk := os.read(read, 1 << 16):
        chunks.append(chunk)
    os.close(read)
    os.waitpid(outer, 0)
    return json.loads(b"".join(chunks) or b'{"failed": "no answer"}')


def test_an_orphan_born_during_the_drain_is_the_tasks_a_sibling_from_the_shell_is_not(tmp_path):
    """The root shares this test's group and session and double-forks an orphan after the
    drain began: re-parented to PID 1, nothing links it to the root, yet it is in the task's
    group and session, so it is the task's. A process this test started meanwhile shares that
    group and session too, but its parent (this test) is inside the session: not the task's.
    Processes born meanwhile in sessions of their own are not the task's either.

    The same in a container (a pid namespace whose PID 1 leads the session everything runs
    in): there the orphan's new parent, PID 1, is inside the task's session, and only its
    being PID 1 marks the orphan as the task's. The drain runs there as pid 2, the root's
    parent, which makes the root no kernel thread."""
    for place in ("host", "container"):
        (tmp_path / place).mkdir()
    host = _orphan_born_during_a_drain(tmp_path / "host")
    assert host["orphan_parent"] == 1 and not host["root_leads"]
    assert host["without_newcomers"] == [host["root"]]  # no newcomers asked for
    assert host["with_newcomers"] == sorted([host["root"], host["orphan"]])
    assert host["reused_pid"] == host["with_newcomers"]
    assert host["reused_pid_by_pids_alone"] == [host["root"]]
    inside = _in_a_container(_orphan_born_during_a_drain, tmp_path / "container")
    if "unavailable" in inside:
        pytest.skip(f"no pid namespace on this host ({inside['unavailable']}): the container case")
    assert "failed" not in inside, inside
    assert inside["orphan_parent"] == 1 and inside["pid_1_in_the_session"] and not inside["root_leads"]
    assert not inside["root_is_a_kernel_thread"] and inside["root_refused"] is None
    assert inside["without_newcomers"] == [inside["root"]]
    assert inside["with_newcomers"] == sorted([inside["root"], inside["orphan"]])
    assert inside["reused_pid"] == inside["with_newcomers"]


def test_the_running_probe_knows_a_process_by_its_pid_and_its_create_time():
    """What the process backend asks of a task's recorded root: a live process with its own
    create time runs; with another create time it is a newer process under a reused pid and
    does not; once it exited and was reaped it does not run, and has no create time or name."""
    proc = subprocess.Popen(["sleep", "60"])
    try:
        born = create_time(proc.pid)
        assert born == psutil.Process(proc.pid).create_time()
        assert running(proc.pid, born) and running(proc.pid, None)
        assert not running(proc.pid, born - 1.0)
        assert proc_name(proc.pid) == "sleep"
    finally:
        proc.kill()
        proc.wait()
    assert not running(proc.pid, born) and not running(proc.pid, None)
    assert create_time(proc.pid) is None
    assert proc_name(proc.pid) == "unknown"


class _Refusing:
    """A member this process may not signal (another user's process, for an unprivileged
    drain): psutil raises AccessDenied."""

    pid = 4_000_000

    def create_time(self) -> float:
        return 1.0

    def send_signal(self, sig) -> None:
        raise psutil.AccessDenied(self.pid)


def test_each_member_is_signalled_once_under_its_recorded_create_time():
    """`sent` holds each member signalled, under the create time the scan recorded. A member
    signalled before (its pid, and a create time within psutil's rounding of it, up to the
    tolerance itself) is not signalled again; a record of another pid born at the same
    instant does not stand for it. A member gone since the scan is skipped and the members
    after it still get the signal; one that refuses is named in the problems."""

    procs = [subprocess.Popen(["sleep", "60"]) for _ in range(3)]
    gone, first, second = (psutil.Process(p.pid) for p in procs)
    procs[0].kill()
    procs[0].wait()
    try:
        created = {first.pid: 0.05, second.pid: 7.0}  # as recorded by the scan
        tree = ProcessTree((gone, first, second, _Refusing()), created)
        sent, problems = signal_tree(tree, signal.SIGCONT)
        assert sent == {(first.pid, 0.05), (second.pid, 7.0)}
        assert len(problems) == 1 and problems[0].startswith(f"pid {_Refusing.pid}: not permitted")
        already = {(first.pid, 0.1), (os.getpid(), 7.0)}  # 0.1 - 0.05: exactly the tolerance
        sent, _ = signal_tree(ProcessTree((first, second), created), signal.SIGCONT, already)
        assert sent == {(second.pid, 7.0)}
        sent, _ = signal_tree(ProcessTree((first, second), created), signal.SIGCONT, {(first.pid, 0.5)})
        assert sent == {(first.pid, 0.05), (second.pid, 7.0)}  # 0.45 s apart: another process
    finally:
        for proc in procs[1:]:
            proc.kill()
            proc.wait()


def test_a_drain_reaches_its_root_only_under_the_roots_own_create_time(tmp_path):
    """`signal_and_wait` of a root given with another create time (its pid reused since the
    task was recorded) signals nothing and leaves the process running; with its own create
    time the root gets the signal and is gone."""

    target = start_target(tmp_path)
    try:
        (root,) = target.pids
        other = signal_and_wait(root, target.created[root] + 10.0, (), signal.SIGTERM, 0.5)
        assert other.sent == frozenset() and other.gone and target.left() == [root]
        done = signal_and_wait(root, target.created[root], (), signal.SIGTERM, 10.0)
        assert done.sent == {(root, target.created[root])} and done.left == () and done.gone
        assert done.problems == () and done.seen == ((root, target.created[root]),)
        assert 0.0 <= done.seconds < 10.0
        assert target.signals()[(root, "SIGTERM")] == 1
    finally:
        target.cleanup()


def test_a_drain_that_runs_out_of_time_names_the_processes_left(tmp_path):
    """The root exits on SIGTERM, its child ignores it: once the time is up the wait returns
    with the child named as left (pid, create time), both signalled once, nothing gone."""

    target = start_target(tmp_path, "--children", "1", "--deaf-children")
    try:
        root, child = target.pids
        waited = signal_and_wait(root, target.created[root], (), signal.SIGTERM, 0.5)
        assert waited.left == ((child, target.created[child]),) and not waited.gone
        assert waited.sent == {(root, target.created[root]), (child, target.created[child])}
        assert waited.seconds >= 0.5 and target.left() == [child]
    finally:
        target.cleanup()


def test_a_pid_that_names_no_drainable_process_is_refused_with_its_reason(tmp_path):
    """What the drain CLI says of a bad target: not a positive integer, PID 1, a pid no
    process has (reaped), one whose process has exited but is not reaped yet (a zombie);
    a live process whose name holds a parenthesis is no kernel thread and opens."""
    import shutil

    for bad in (0, -1, True, "7"):
        with pytest.raises(NoSuchProcessError, match=rf"^pid must be a positive integer, got {bad!r}$"):
            open_process(bad)
    with pytest.raises(ProtectedProcessError, match="^pid 1 is PID 1"):
        open_process(1)
    reaped = subprocess.Popen(["true"])
    reaped.wait()
    with pytest.raises(NoSuchProcessError, match=rf"^no process with pid {reaped.pid}$"):
        open_process(reaped.pid)
    zombie = subprocess.Popen(["true"])
    try:
        while psutil.Process(zombie.pid).status() != psutil.STATUS_ZOMBIE:
            pass
        with pytest.raises(
            NoSuchProcessError, match=rf"^no process with pid {zombie.pid} \(it has exited\)$"
        ):
            open_process(zombie.pid)
    finally:
        zombie.wait()
    odd = tmp_path / "a) b"
    shutil.copy(shutil.which("sleep"), odd)
    named = subprocess.Popen([str(odd), "60"])
    try:
        while proc_name(named.pid) != "a) b":
            pass
        assert not kernel_thread(named.pid) and refusal(named.pid) is None
        assert open_process(named.pid).pid == named.pid
    finally:
        named.kill()
        named.wait()


@pytest.mark.skipif(not kernel_thread(2), reason="pid 2 is no kernel thread here")
def test_a_kernel_thread_is_refused_by_its_name():
    """A kernel thread is never a drain's target, nor a member of a task's tree, even when
    named as the root or known from before."""
    assert refusal(2) == f"pid 2 is a kernel thread ({psutil.Process(2).name()}): refusing to drain it"
    kthreadd = psutil.Process(2).create_time()
    assert task_tree(2, kthreadd).members == () and task_tree(2, None, [(2, kthreadd)]).members == ()


def test_known_members_past_a_gone_one_are_found_and_this_process_never_is():
    """Members known from before: one gone (reaped) does not hide those after it, this
    process is never a member even when named, and a member reaped since the scan is not
    alive."""
    gone = subprocess.Popen(["true"])
    gone.wait()
    live = subprocess.Popen(["sleep", "60"])
    try:
        me = psutil.Process()
        born = psutil.Process(live.pid).create_time()
        known = [(gone.pid, 1.0), (os.getpid(), me.create_time()), (live.pid, born)]
        tree = task_tree(gone.pid, 1.0, known)
        assert _pids(tree) == [live.pid] and tree.alive
    finally:
        live.kill()
        live.wait()
    assert not tree.alive


def test_kernel_threads_are_told_from_the_procfs_psutil_reads(tmp_path, monkeypatch):
    """An agent that reads another procfs through psutil (`psutil.PROCFS_PATH`, e.g. the host's
    mounted in a container) judges kernel threads by that procfs, the one whose processes it
    lists and signals: the PF_KTHREAD flag of each stat, read past the last `)` of the name.
    A pid with no stat there runs no process, or there is no procfs: only pid 2 (kthreadd)
    is then taken for one."""
    stats = {
        100: "100 (kworker/0:1-events) I 2 0 0 0 -1 2129984 0 0",  # a kernel thread
        200: "200 (python) S 2 200 200 0 -1 4194304 0 0",  # a user process whose parent is pid 2
        300: "300 (a) b (c) I 2 0 0 0 -1 2129984 0 0",  # a kernel thread with `)` in its name
        400: "400 (worker) S 1 400 400 0 -1 not-a-number 0 0",  # unreadable flags
    }
    for pid, stat in stats.items():
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "stat").write_text(stat + "\n")
    monkeypatch.setattr(psutil, "PROCFS_PATH", str(tmp_path))
    assert [kernel_thread(pid) for pid in (100, 200, 300, 400)] == [True, False, True, False]
    assert kernel_thread(2) and not kernel_thread(3) and not kernel_thread(os.getpid())


PR_SET_CHILD_SUBREAPER = 36


def test_an_orphan_gone_as_it_is_read_does_not_hide_the_next(tmp_path, monkeypatch):
    """The root leads its session and double-forks two orphans; its launcher (this test) is a
    subreaper (as systemd, tini -s or a container shim are), so they are re-parented to it,
    outside the task's session. The root exits while the drain runs: nothing links the orphans
    to the root any more, only the drain's newcomers find them. One of them exits just as the
    drain reads its parent: the other is still found."""
    libc = ctypes.CDLL(None, use_errno=True)
    assert libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    try:
        before = frozenset(psutil.pids())
        target = start_target(tmp_path, "--setsid", "--orphans", "2")
        orphans = target.pids[1:]
        deadline = time.monotonic() + 10
        while any(psutil.Process(pid).ppid() != os.getpid() for pid in orphans):
            assert time.monotonic() < deadline, "the orphans were not re-parented to this test"
            time.sleep(0.01)
    finally:
        libc.prctl(PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)
    root = target.pids[0]
    try:
        target.proc.kill()
        target.proc.wait()
        assert task_tree(root, target.created[root]).members == ()  # nothing known, root gone
        real_ppid, gone = psutil.Process.ppid, []

        def ppid(proc):
            if proc.pid in orphans and not gone:  # the first orphan the drain reads exits now
                gone.append(proc.pid)
                os.kill(proc.pid, signal.SIGKILL)
                os.waitpid(proc.pid, 0)
            return real_ppid(proc)

        monkeypatch.setattr(psutil.Process, "ppid", ppid)
        tree = task_tree(root, target.created[root], (), Newcomers(before, frozenset({(root, root)})))
        assert len(gone) == 1 and _pids(tree) == [pid for pid in orphans if pid not in gone]
    finally:
        monkeypatch.undo()
        target.cleanup()
        while True:  # reap what this test adopted (the orphans, the root's forks)
            try:
                if os.waitpid(-1, os.WNOHANG)[0] == 0:
                    break
            except ChildProcessError:
                break


NOBODY = 65534


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to start another user's process")
def test_an_unprivileged_drain_names_the_process_it_may_not_signal():
    """A drain run by an unprivileged agent: one member belongs to root, which the agent may
    neither stop nor signal; the agent's own members get the signal. The member it could not
    signal is named in the problems, once, also after that member exited on its own while the
    drain went on (here when the agent's member it waits for died); a member deaf to the
    signal is left when the time is up."""
    read, write = os.pipe()
    theirs = subprocess.Popen([sys.executable, "-c", f"import os; os.read({read}, 1)"], pass_fds=(read,))
    ours = subprocess.Popen(["sleep", "60"], user=NOBODY, stdout=write)  # its end: theirs exits
    deaf = subprocess.Popen(["sh", "-c", "trap '' TERM; exec sleep 60"], user=NOBODY)
    os.close(read)
    os.close(write)
    try:
        while psutil.Process(deaf.pid).name() != "sleep":
            time.sleep(0.01)
        ref = {p.pid: (p.pid, psutil.Process(p.pid).create_time()) for p in (theirs, ours, deaf)}
        os.setresuid(NOBODY, NOBODY, 0)
        try:
            waited = signal_and_wait(
                theirs.pid, ref[theirs.pid][1], [ref[ours.pid], ref[deaf.pid]], signal.SIGTERM, 1.5
            )
        finally:
            os.setresuid(0, 0, 0)
        assert len(waited.problems) == 1, waited.problems
        assert waited.problems[0].startswith(f"pid {theirs.pid}: not permitted"), waited.problems
        assert waited.sent == {ref[ours.pid], ref[deaf.pid]}
        # the deaf member is left; so is theirs only where a loaded machine kept it from exiting
        assert set(waited.left) - {ref[theirs.pid]} == {ref[deaf.pid]} and not waited.gone
        assert theirs.wait(timeout=10) == 0 and ours.wait(timeout=10) == -signal.SIGTERM
    finally:
        for proc in (theirs, ours, deaf):
            proc.kill()
            proc.wait()


def test_a_member_gone_before_it_is_let_run_again_does_not_keep_the_next_stopped(monkeypatch):
    """The drain stops every member, signals them and lets them run again (SIGCONT): a stopped
    process cannot act on its SIGTERM. A member killed and reaped from outside in between (an
    operator's kill -9, the OOM killer) does not keep the members after it stopped: the next
    one runs its SIGTERM handler and exits, and the task is gone."""
    killed = subprocess.Popen(["sleep", "60"])
    handler = "import signal, sys, time\nsignal.signal(signal.SIGTERM, lambda *_: sys.exit(3))\n"
    graceful = subprocess.Popen(
        [sys.executable, "-c", handler + "print('ready', flush=True)\ntime.sleep(60)"], stdout=subprocess.PIPE
    )
    try:
        assert graceful.stdout.readline().strip() == b"ready"
        ref = {p.pid: (p.pid, psutil.Process(p.pid).create_time()) for p in (killed, graceful)}
        real_resume, resumed = psutil.Process.resume, []

        def resume(proc):
            if proc.pid == killed.pid:
                killed.kill()
                killed.wait()
            resumed.append(proc.pid)
            return real_resume(proc)

        monkeypatch.setattr(psutil.Process, "resume", resume)
        waited = signal_and_wait(killed.pid, ref[killed.pid][1], [ref[graceful.pid]], signal.SIGTERM, 5.0)
        monkeypatch.undo()
        assert resumed == [killed.pid, graceful.pid]
        assert waited.gone and waited.left == () and waited.sent == set(ref.values())
        assert graceful.wait(timeout=10) == 3  # its handler ran
    finally:
        for proc in (killed, graceful):
            proc.kill()
            proc.wait()


# CPU seconds of a process tree (`bench scale` accounts its workers and servers with them). Each
# process burns user or system time (reading /dev/zero is spent in the kernel), then prints its
# own os.times() (user, system, children's user, children's system) and waits for its stdin to
# end: from then on it spends nothing, so the tree's count must be the sum of what they printed.
BURN = textwrap.dedent(
    """
    import ctypes, os, subprocess, sys

    PROGRAM = f"SOURCE = {SOURCE!r}\\n" + SOURCE
    def burn(seconds, system=False):
        # until the clock it is meant to fill has grown by `seconds`: a loop of reads also
        # spends user time, and under load the split moves (0.09 s of system time seen once)
        clock = (lambda: os.times().system) if system else (lambda: os.times().user)
        end = clock() + seconds
        with open("/dev/zero", "rb", buffering=0) as zero:
            while clock() < end:
                zero.read(1 << 20) if system else sum(range(50_000))

    def spent():
        print("spent", *os.times()[:4], flush=True)

    def child(role):
        return subprocess.Popen([sys.executable, "-c", PROGRAM, role], stdin=subprocess.PIPE)

    role = sys.argv[1]
    if role == "root":  # user time; a child that spends user and system time and is reaped
        burn(0.15)
        subprocess.run([sys.executable, "-c", PROGRAM, "reaped"], check=True)
        kids = [child("live")]
    elif role == "reaped":
        burn(0.15)
        burn(0.15, system=True)
        sys.exit(0)
    elif role == "live":  # system time, with a grandchild of the root below it
        kids = [child("grandchild")]
        burn(0.15, system=True)
    elif role == "grandchild":
        kids = []
        burn(0.15)
    elif role.startswith("server:"):  # named like the server, with a forked worker
        ctypes.CDLL(None).prctl(15, role[7:].encode(), 0, 0, 0)  # PR_SET_NAME
        kids = [os.fork()]
        if kids[0] == 0:
            burn(0.2)
            spent()
            sys.stdin.read()
            os._exit(0)
        burn(0.1)
    spent()
    sys.stdin.read()
    for kid in kids:
        kid.communicate(b"") if isinstance(kid, subprocess.Popen) else os.waitpid(kid, 0)
    """
)


def _start_burning(role: str, reports: int) -> tuple[subprocess.Popen, float]:
    """Start `role`; wait until `reports` processes printed what they spent; (process, sum)."""
    proc = subprocess.Popen(
        [sys.executable, "-c", f"SOURCE = {BURN!r}\n" + BURN, role],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    spent = []
    while len(spent) < reports:
        line = proc.stdout.readline().split()
        assert line and line[0] == b"spent", line
        spent.append([float(x) for x in line[1:]])
    return proc, spent


def test_a_tree_counts_itself_its_reaped_children_and_its_live_ones_all_the_way_down():
    """The root's own time, what its reaped child spent (user and system), and its live
    descendants' (a child and a grandchild below it), each once: the sum of what each
    process says it spent, to within a few clock ticks; nothing once the root is gone."""
    root, spent = _start_burning("root", 3)
    try:
        counted = tree_cpu_seconds(root.pid)
    finally:
        root.communicate(b"", timeout=60)
    # each part is large enough that leaving it out, or counting it twice, is seen
    assert max(s[2] for s in spent) >= 0.1 and max(s[3] for s in spent) >= 0.1  # the reaped child
    assert sorted(s[1] >= 0.1 for s in spent) == [False, False, True]  # the live child's system time
    assert abs(counted - sum(map(sum, spent))) < 0.08, (counted, spent)
    assert tree_cpu_seconds(root.pid) == 0.0  # gone


def test_a_server_counts_each_of_its_trees_once_with_its_workers():
    """Two processes named like the server, each with a forked worker of that name: each tree
    is counted once (a worker whose parent has the server's name is not a tree of its own);
    a name that no process has spends nothing."""
    name = f"srv{os.getpid() % 100000}"
    servers = [_start_burning(f"server:{name}", 2) for _ in range(2)]
    try:
        for proc, _ in servers:
            assert psutil.Process(proc.pid).name() == name
        counted = server_cpu_seconds(name)
    finally:
        for proc, _ in servers:
            proc.communicate(b"", timeout=60)
    spent = [report for _, reports in servers for report in reports]
    assert abs(counted - sum(map(sum, spent))) < 0.08, (counted, spent)
    assert server_cpu_seconds(name) == 0.0 and server_cpu_seconds("no-such-server-here") == 0.0


def test_a_member_that_ends_as_its_time_is_read_does_not_hide_the_rest(monkeypatch):
    """This process's own tree, with two children that burned CPU: one of them ends (killed
    and reaped) just as its time is read; the other's time is still counted, on top of this
    process's own."""
    kids = [_start_burning("grandchild", 1) for _ in range(2)]
    pids = [proc.pid for proc, _ in kids]
    real_cpu_times, gone = psutil.Process.cpu_times, []

    def cpu_times(proc):
        if proc.pid in pids and not gone:
            gone.append(proc.pid)
            os.kill(proc.pid, signal.SIGKILL)
            kids[pids.index(proc.pid)][0].wait()
        return real_cpu_times(proc)

    try:
        mine = sum(os.times()[:4])
        monkeypatch.setattr(psutil.Process, "cpu_times", cpu_times)
        counted = tree_cpu_seconds(os.getpid())
        monkeypatch.undo()
        (left,) = (spent for proc, spent in kids if proc.pid not in gone)
        assert len(gone) == 1 and sum(left[0]) >= 0.1
        assert counted >= mine + sum(left[0]) - 0.02, (counted, mine, left)
    finally:
        for proc, _ in kids:
            proc.kill()
            proc.communicate()
