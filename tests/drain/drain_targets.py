"""Helpers for the drain hardening tests: start signal targets, run CLI drains in forks,
and count what the targets saw (signals per process, processes left)."""

from __future__ import annotations

import argparse
import multiprocessing
import os
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import psutil

from market_pipeline.drain import commands

TARGET = Path(__file__).with_name("signal_target.py")


@dataclass
class Target:
    proc: subprocess.Popen
    pids: list[int]
    log: Path
    created: dict[int, float]

    def spawned(self) -> list[int]:
        """Processes the tree started after `ready` (--fork-on-term), from the log."""
        return sorted({pid for pid, name in self.signals() if name == "SPAWNED"})

    def signals(self) -> Counter[tuple[int, str]]:
        """(pid, signal name) -> how many times that process received it."""
        lines = self.log.read_text().split("\n") if self.log.exists() else []
        return Counter((int(p), s) for p, s, _ in (line.split() for line in lines if line))

    def first(self, name: str) -> float:
        """When the root first received `name` (unix time)."""
        lines = [line.split() for line in self.log.read_text().splitlines()]
        return min(float(t) for p, s, t in lines if s == name and int(p) == self.pids[0])

    def left(self) -> list[int]:
        """Processes of the tree still running (zombies have exited: they only wait to be reaped)."""
        alive = []
        for pid in self.pids + self.spawned():
            try:
                proc = psutil.Process(pid)
                if (
                    proc.create_time() == self.created.get(pid, proc.create_time())
                    and proc.status() != psutil.STATUS_ZOMBIE
                ):
                    alive.append(pid)
            except psutil.NoSuchProcess:
                continue
        return alive

    def cleanup(self) -> None:
        for pid in self.left():
            try:
                os.kill(pid, 9)
            except ProcessLookupError:
                pass
        self.proc.kill()
        self.proc.wait()


def start_target(tmp: Path, *flags: str) -> Target:
    log = tmp / f"signals-{len(list(tmp.glob('signals-*')))}.log"
    proc = subprocess.Popen(
        [sys.executable, str(TARGET), str(log), *flags], stdout=subprocess.PIPE, text=True
    )
    line = proc.stdout.readline().split()
    assert line and line[0] == "ready", line
    pids = [int(p) for p in line[1:]]
    return Target(proc, pids, log, {pid: psutil.Process(pid).create_time() for pid in pids})


def cli(argv: list[str]) -> int:
    """This concern's subcommands alone (the full CLI imports every concern)."""
    parser = argparse.ArgumentParser(prog="market-pipeline")
    commands.register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.handler(args)


def _forked(argv: list[str], out: str) -> None:
    with open(out, "w", buffering=1) as sink:
        sys.stdout = sys.stderr = sink  # pytest's capture replaced the standard streams
        code = cli(argv)
        sink.flush()
    os._exit(code)


def fork_cli(argv: list[str], out: Path) -> multiprocessing.Process:
    """`drain ...` in a forked process (which a test may kill -9); output goes to `out`."""
    proc = multiprocessing.get_context("fork").Process(target=_forked, args=(argv, str(out)))
    proc.start()
    return proc
