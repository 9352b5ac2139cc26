"""Issue 40's drain reach, each as a test: a drain ends every process of the task (also
grandchildren of a root that leads no group or session, and a process born while the root
exits), and never signals a kernel thread."""

from __future__ import annotations

import json
import os
import subprocess

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
    signal_and_wait,
    signal_tree,
    task_tree,
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
    so does a double-forked orphan nothing links to any member: both are the task's."""
    import signal

    target = start_target(tmp_path, "--setsid", "--children", "1", "--orphans", "1")
    try:
        root = target.pids[0]
        (child,) = (pid for pid in target.pids if psutil.Process(pid).ppid() == root)
        (orphan,) = (pid for pid in target.pids[1:] if psutil.Process(pid).ppid() not in target.pids)
        os.kill(root, signal.SIGKILL)
        target.proc.wait(timeout=10)
        tree = task_tree(root, target.created[root], [(child, target.created[child])])
        assert _pids(tree) == sorted([child, orphan])
    finally:
        target.cleanup()


def test_an_orphan_born_during_the_drain_is_the_tasks_a_sibling_from_the_shell_is_not(tmp_path):
    """The root shares this test's group and session and double-forks an orphan after the
    drain began: re-parented to PID 1, nothing links it to the root, yet it is in the task's
    group and session, so it is the task's. A process this test started meanwhile shares that
    group and session too, but its parent (this test) is inside the session: not the task's.
    Processes born meanwhile in sessions of their own are not the task's either."""
    before = frozenset(psutil.pids())
    target = start_target(tmp_path, "--orphans", "1")
    sibling = subprocess.Popen(["sleep", "60"])
    outsiders = [subprocess.Popen(["sleep", "60"], start_new_session=True) for _ in range(8)]
    try:
        root = target.pids[0]
        (orphan,) = target.pids[1:]
        assert psutil.Process(orphan).ppid() == 1 and root not in (os.getpgid(root), os.getsid(root))
        groups = frozenset({(os.getpgid(root), os.getsid(root))})
        assert _pids(task_tree(root, target.created[root])) == [root]  # no newcomers asked for
        tree = task_tree(root, target.created[root], (), Newcomers(before, groups))
        assert _pids(tree) == sorted([root, orphan])
    finally:
        for proc in (sibling, *outsiders):
            proc.kill()
            proc.wait()
        target.cleanup()


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
    import signal

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
    import signal

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
    import signal

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
