"""Running the Slurm CLIs: every call bounded in time and output, its failure typed.

The Slurm 22.05 CLIs speak JSON (`sinfo --json`, `squeue --json`, `sacct --json`) or one line
per record (`scontrol -o`, `sacctmgr -P`); no pyslurm release builds against 22.05, so the
CLIs are the interface. The accounting reads (`sacct`, `sacctmgr`) need slurmdbd; `sacct` is
always asked for a bounded time window.
This module only runs them and classifies failures; `parse` reads what they print.

Failures become one of:
- `SlurmUnavailable`: slurmctld cannot be reached or munge cannot sign a request. The
  message names which, in one line.
- `SlurmNotFound`: the node or job named does not exist (any more).
- `SlurmTimeout`: the command did not answer within its timeout.
- `SlurmError`: anything else the command reported (its last stderr line).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

MAX_OUTPUT_BYTES = 64 * 1024 * 1024  # a reply larger than this is refused, not parsed


class SlurmError(RuntimeError):
    """A Slurm command failed; the message is one line naming the command and the cause."""


class SlurmUnavailable(SlurmError):
    """slurmctld is down or munge is unreachable: nothing can be asked or done now."""


class SlurmNotFound(SlurmError):
    """The node or job does not exist (any more)."""


class SlurmTimeout(SlurmError):
    """The command did not answer within its timeout."""


_MUNGE = re.compile(r"munge|authentication|auth_g_|credential", re.IGNORECASE)
_CONTROLLER = re.compile(
    r"unable to contact slurm controller|connection refused|slurm_persist_conn|"
    r"slurmctld.*(down|not responding)|zero bytes were transmitted|socket timed out",
    re.IGNORECASE,
)
_NOT_FOUND = re.compile(
    r"invalid job id|invalid node name|job has already finished|does not exist|"
    r"invalid (job|node)|already completing or completed|job/step already completing",
    re.IGNORECASE,
)


def classify(command: str, returncode: int, stderr: str) -> SlurmError:
    """The typed error for a failed command from its stderr (pure: testable without Slurm)."""
    lines = [line.strip() for line in stderr.strip().splitlines() if line.strip()]
    last = lines[-1] if lines else f"exit status {returncode}"
    text = " ".join(lines)
    if _MUNGE.search(text) and "munge" in text.lower():
        munge = [line for line in lines if "encode failed" in line.lower()] or [
            line for line in lines if "munge" in line.lower()
        ]
        return SlurmUnavailable(f"{command}: munge is unreachable ({munge[0]})")
    if _CONTROLLER.search(text):
        return SlurmUnavailable(f"{command}: slurmctld is unreachable ({last})")
    if _NOT_FOUND.search(text):
        return SlurmNotFound(f"{command}: {last}")
    return SlurmError(f"{command}: {last}")


@dataclass
class CallStats:
    calls: int = 0
    seconds: list[float] = field(default_factory=list)


@dataclass
class SlurmClient:
    """The Slurm CLIs against one cluster (`SLURM_CONF`), each call within `timeout_seconds`."""

    conf: Path | None = None
    timeout_seconds: float = 10.0
    stats: CallStats = field(default_factory=CallStats)

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        if self.conf is not None:
            env["SLURM_CONF"] = str(self.conf)
        return env

    def run(self, argv: Sequence[str], timeout_seconds: float | None = None) -> str:
        return self._run(argv, timeout_seconds)[0]

    def _run(self, argv: Sequence[str], timeout_seconds: float | None = None) -> tuple[str, str]:
        command = " ".join(argv[:3])
        timeout = self.timeout_seconds if timeout_seconds is None else timeout_seconds
        started = time.monotonic()
        try:
            done = subprocess.run(
                list(argv),
                env=self.env(),
                capture_output=True,
                timeout=timeout,
                check=False,
                stdin=subprocess.DEVNULL,
            )
        except subprocess.TimeoutExpired:
            raise SlurmTimeout(f"{command}: no answer within {timeout:g}s") from None
        except FileNotFoundError:
            raise SlurmUnavailable(f"{argv[0]}: not installed (apt-get install slurm-client)") from None
        finally:
            self.stats.calls += 1
            self.stats.seconds.append(time.monotonic() - started)
        if len(done.stdout) > MAX_OUTPUT_BYTES:
            raise SlurmError(
                f"{command}: reply of {len(done.stdout)} bytes over the {MAX_OUTPUT_BYTES} limit"
            )
        stderr = done.stderr.decode(errors="replace")
        if done.returncode != 0:
            raise classify(command, done.returncode, stderr)
        return done.stdout.decode(errors="replace"), stderr

    def run_json(self, argv: Sequence[str]) -> dict[str, Any]:
        command = " ".join(argv[:2])
        text, stderr = self._run(argv)
        try:
            data = json.loads(text)
        except ValueError:
            raise SlurmError(f"{command}: reply is not JSON") from None
        errors = [e for e in data.get("errors", []) if e]
        if errors:
            first = errors[0]
            message = str(first.get("error") or first.get("description") or first)
            error = classify(command, 1, f"{stderr}\n{message}")
            if type(error) is SlurmError:
                # The JSON says only "Unspecified error" when slurmctld is down: ask it.
                self.ping(command)
            raise error
        return data

    def ping(self, command: str = "scontrol ping") -> None:
        """Raise SlurmUnavailable naming slurmctld (or munge) if the controller does not answer."""
        try:
            done = subprocess.run(
                ["scontrol", "ping"],
                env=self.env(),
                capture_output=True,
                timeout=self.timeout_seconds,
                check=False,
                stdin=subprocess.DEVNULL,
            )
        except (subprocess.TimeoutExpired, FileNotFoundError):
            raise SlurmUnavailable(f"{command}: slurmctld does not answer (scontrol ping)") from None
        text = (done.stdout + done.stderr).decode(errors="replace")
        if "munge" in text.lower():
            raise classify(command, done.returncode, text)
        if done.returncode != 0 or "DOWN" in text:
            first = text.strip().splitlines()[0] if text.strip() else f"exit status {done.returncode}"
            raise SlurmUnavailable(f"{command}: slurmctld is unreachable ({first})")

    # -- reads ------------------------------------------------------------------------------
    def sinfo_nodes(self) -> list[dict[str, Any]]:
        """Every node, one record each: `sinfo --json`'s "nodes" (22.05, 23.02). From 23.11
        `sinfo --json` prints groups of nodes ("sinfo") instead, and the records are
        `scontrol --json show nodes`' (which 22.05 does not have)."""
        out = self.run_json(["sinfo", "--json"])
        if "nodes" in out:
            return out["nodes"]
        return self.run_json(["scontrol", "--json", "show", "nodes"]).get("nodes", [])

    def squeue_jobs(self) -> list[dict[str, Any]]:
        return self.run_json(["squeue", "--json"]).get("jobs", [])

    def sacct_jobs(self, start: datetime, end: datetime) -> list[dict[str, Any]]:
        """`sacct --json` of every user's jobs that ran in [start, end), each run of a requeued
        job apart (`--duplicates`); slurmdbd's record (needs accounting storage)."""
        window = [f"--starttime={_slurm_time(start)}", f"--endtime={_slurm_time(end)}"]
        try:
            return self.run_json(["sacct", "--json", "--allusers", "--duplicates", *window]).get("jobs", [])
        except SlurmError as exc:
            if type(exc) is SlurmError and "nothing found" in str(exc).lower():
                return []  # 22.05 reports an empty window as an error
            raise

    def accounts(self) -> list[str]:
        """The accounts slurmdbd knows (`sacctmgr show account`), one per line."""
        text = self.run(["sacctmgr", "--noheader", "--parsable2", "show", "account", "format=account"])
        return [line.strip() for line in text.splitlines() if line.strip()]

    def show_job(self, job_id: str) -> str:
        """`scontrol -o show job ID -d`: one line of key=value pairs (with GRES indices)."""
        return self.run(["scontrol", "-o", "-d", "show", "job", job_id])

    def show_jobs(self) -> str:
        return self.run(["scontrol", "-o", "-d", "show", "job"])

    def show_nodes(self) -> str:
        return self.run(["scontrol", "-o", "show", "node"])

    # -- actions ----------------------------------------------------------------------------
    def update_node(self, node: str, state: str, reason: str = "") -> None:
        argv = ["scontrol", "update", f"nodename={node}", f"state={state}"]
        if reason:
            argv.append(f"reason={reason}")
        self.run(argv)

    def signal_job(self, job_id: str, signal_name: str, *, full: bool = False) -> None:
        # Without --batch or --full scancel returns 0 and reaches no process of a batch job.
        self.run(["scancel", f"--signal={signal_name}", "--full" if full else "--batch", job_id])

    def cancel(self, job_id: str) -> None:
        self.run(["scancel", job_id])

    def requeue(self, job_id: str) -> None:
        self.run(["scontrol", "requeue", job_id])

    def set_begin(self, job_id: str, moment: datetime) -> None:
        """A pending job's begin time (`scontrol update StartTime=...`): it is not started before."""
        self.run(["scontrol", "update", f"jobid={job_id}", f"StartTime={_slurm_time(moment)}"])

    def partition_nodes(self, partition: str) -> str:
        """The node list a partition is defined with (`scontrol -o show partition`: its `Nodes=`
        as Slurm prints it, `ALL` or a host list); `SlurmNotFound` where no such partition is."""
        text = self.run(["scontrol", "-o", "show", "partition"])  # one named but missing: exit 1, no stderr
        return parse_partition_nodes(partition, text)

    def set_partition_nodes(self, partition: str, nodes: str) -> None:
        """A partition's node list (`scontrol update PartitionName=P Nodes=...`): running jobs
        stay where they run, pending ones of the partition may start only on these nodes."""
        self.run(["scontrol", "update", f"PartitionName={partition}", f"Nodes={nodes}"])

    def submit(self, argv: Sequence[str]) -> str:
        """`sbatch --parsable ...`: the new job's id."""
        out = self.run(["sbatch", "--parsable", *argv]).strip()
        return out.split(";")[0]


def _slurm_time(moment: datetime) -> str:
    """A time as the Slurm CLIs read it (local time of the machine, to the second)."""
    return moment.astimezone().replace(tzinfo=None).isoformat(timespec="seconds")


def parse_partition_nodes(partition: str, text: str) -> str:
    """`Nodes=` of one partition's `scontrol -o show partition` line (pure: testable without
    Slurm). `AllocNodes=` and the like are other keys; a missing partition is `SlurmNotFound`."""
    for line in text.splitlines():
        fields = dict(f.split("=", 1) for f in line.split() if "=" in f)
        if fields.get("PartitionName") == partition:
            nodes = fields.get("Nodes", "")
            return "" if nodes == "(null)" else nodes
    raise SlurmNotFound(f"scontrol show partition: partition {partition} does not exist")
