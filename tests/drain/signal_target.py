"""A drain target for tests: logs every signal it gets, and can fork a process tree.

python signal_target.py LOG [--setsid] [--children N] [--grandchildren] [--orphans N]
                         [--deaf-children] [--fork-on-term] [--storm N] [--storm-setsid]
Each process appends "<pid> <SIGNAME> <unix time>" to LOG per signal it receives. The root
catches SIGUSR1 (a warning) and exits 0.3 s after SIGTERM. Children exit on SIGTERM unless
--deaf-children; with --grandchildren each child starts one grandchild first; orphans are
double-forked (re-parented to PID 1 at once). With --fork-on-term the root's SIGTERM
handler starts one more process (logged as "<pid> SPAWNED <time>") and exits at once, so
that process is re-parented while the drain runs. With --storm N the root, from its warning
(SIGUSR1) on, starts up to N more children one every millisecond (each logged as SPAWNED
by the root) and exits at once on SIGTERM; with --storm-setsid each of those children
starts a session of its own at once (so neither its group nor its session is the root's). When all are up, the root prints
"ready <pid> <pid> ..." (every process of the tree) on stdout.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("log")
    parser.add_argument("--setsid", action="store_true")
    parser.add_argument("--children", type=int, default=0)
    parser.add_argument("--orphans", type=int, default=0)
    parser.add_argument("--grandchildren", action="store_true")
    parser.add_argument("--deaf-children", action="store_true")
    parser.add_argument("--fork-on-term", action="store_true")
    parser.add_argument("--storm", type=int, default=0)
    parser.add_argument("--storm-setsid", action="store_true")
    args = parser.parse_args()
    if args.setsid:
        os.setsid()
    log = open(args.log, "a", buffering=1)
    root = os.getpid()

    warned = False

    def note(sig: int, _frame: object) -> None:
        nonlocal warned
        warned = warned or sig == signal.SIGUSR1
        log.write(f"{os.getpid()} {signal.Signals(sig).name} {time.time():.3f}\n")
        if sig == signal.SIGTERM and args.fork_on_term and os.getpid() == root:
            child = os.fork()
            if child == 0:
                _idle()
            log.write(f"{child} SPAWNED {time.time():.3f}\n")  # by the parent: always written
            os._exit(0)
        if sig == signal.SIGTERM and args.storm and os.getpid() == root:
            os._exit(0)
        if sig == signal.SIGTERM and not (args.deaf_children and os.getpid() != root):
            if os.getpid() == root:
                time.sleep(0.3)
            os._exit(0)

    for sig in (signal.SIGUSR1, signal.SIGTERM):
        signal.signal(sig, note)
    read, write = os.pipe()
    for _ in range(args.children):
        if os.fork() == 0:
            if args.grandchildren and os.fork() == 0:
                os.write(write, f"{os.getpid()} ".encode())
                return _idle()
            os.write(write, f"{os.getpid()} ".encode())
            return _idle()
    for _ in range(args.orphans):
        middle = os.fork()
        if middle == 0:
            if os.fork() == 0:
                os.write(write, f"{os.getpid()} ".encode())
                return _idle()
            os._exit(0)  # the middle process: its child is re-parented to PID 1
        # reaped before "ready", as a daemonising double fork does: once it is gone, the orphan
        # has its new parent (on a loaded host it could still be the middle one's child)
        os.waitpid(middle, 0)
    pids = [str(root)]
    while len(pids) < 1 + args.children * (2 if args.grandchildren else 1) + args.orphans:
        pids += os.read(read, 4096).decode().split()
    # each process wrote "<pid> " once: a torn or doubled token would mis-address the tests' signals
    assert all(p.isdigit() for p in pids) and len(set(pids)) == len(pids), pids
    print("ready " + " ".join(pids), flush=True)
    while args.storm and not warned:
        time.sleep(0.005)
    for _ in range(args.storm):
        child = os.fork()
        if child == 0:
            if args.storm_setsid:
                os.setsid()
            _idle()
        log.write(f"{child} SPAWNED {time.time():.3f}\n")
        time.sleep(0.001)
    _idle()


def _idle() -> None:
    sys.stdout.flush()
    while True:
        time.sleep(0.05)


if __name__ == "__main__":
    main()
