"""Reading what the Slurm CLIs print: pure functions over `sinfo --json`, `squeue --json`,
`scontrol -o` lines and the job completion log. No process is run here.

Slurm has no GPU UUID: a GPU is named by its node and GRES index (`gpu:h800:2(IDX:0-1)` on
node3 is `node3:gpu0` and `node3:gpu1`; not `/`, which telemetry reads as a MIG instance of a GPU). A node's pool is its GPU's GRES type (resolved to
a configured model by the caller) and the zone its `zone_<zone>` feature names.

Both JSON dialects are read: 22.05's (a state is a string, with the flags apart in
`state_flags`; a time or count a plain number; a comment and the features strings) and that
of 23.02 on (a state is a list, base state first and its flags after; a time or count is
`{"set": true, "number": N}`; a job's comment is `{"job": ...}`; the features are lists).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

ZONE_FEATURE_PREFIX = "zone_"

# Node base states the adapter understands and acts on; every other one (down, error,
# future, unknown, ...) and the flags below are read and reported, never acted on.
KNOWN_BASE_STATES = frozenset({"idle", "mixed", "allocated", "completing"})
UNHEALTHY_FLAGS = frozenset(
    {"FAIL", "NOT_RESPONDING", "INVALID", "INVALID_REG", "MAINTENANCE", "REBOOT_ISSUED"}
)
POWER_OFF_FLAGS = frozenset({"POWERED_DOWN", "POWERING_DOWN"})
POWERING_UP_FLAGS = frozenset({"POWERING_UP", "POWER_UP"})
DRAIN_FLAGS = frozenset({"DRAIN", "DRAINING", "DRAINED"})
# Job states whose job still holds (or may hold) its GPUs.
HOLDING_JOB_STATES = frozenset({"RUNNING", "COMPLETING", "CONFIGURING", "SUSPENDED", "STOPPED", "SIGNALING"})
# Why a pending job waits, where the wait is for capacity: free resources (`Resources`), jobs
# ahead of it (`Priority`), nodes it asks for that are down, drained or reserved
# (`ReqNodeNotAvail, ...`), or no reason yet (`None`: the scheduler has not tried it since it
# was submitted). A job held, waiting on a dependency, a begin time or a limit of its account
# does not wait for capacity: no drain would start it.
CAPACITY_REASONS = ("Resources", "Priority", "ReqNodeNotAvail", "Nodes_required_for_job_are_DOWN", "None")


def _number(value: Any) -> int | None:
    """A count or a unix time as either dialect writes it: N, "N" or {"set": true, "number": N}
    (None where unset)."""
    if isinstance(value, Mapping):
        value = value.get("number") if value.get("set", True) else None
    if isinstance(value, bool) or value is None:
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def _state(value: Any) -> tuple[str, frozenset[str]]:
    """(base state, flags) of a state either dialect writes: "MIXED" or ["MIXED", "DRAIN"]."""
    if not isinstance(value, (list, tuple)):
        return str(value or ""), frozenset()
    items = [str(v) for v in value]
    return (items[0] if items else ""), frozenset(v.upper() for v in items[1:])


def _text(value: Any, key: str = "job") -> str:
    """A string field either dialect writes: "a,b", ["a", "b"] or {key: "..."}."""
    if isinstance(value, Mapping):
        return str(value.get(key) or "")
    if isinstance(value, (list, tuple)):
        return ",".join(str(v) for v in value)
    return str(value or "")


_GRES_ITEM = re.compile(
    r"(?P<name>[^:,()]+)(?::(?P<type>[^:,()]+))?(?::(?P<count>\d+))?(?:\((?P<extra>[^)]*)\))?"
)


def gpu_id(node: str, index: int) -> str:
    """A GPU's stable id: its node and GRES index (Slurm knows no GPU UUID)."""
    return f"{node}:gpu{index}"


def split_gres(text: str) -> list[str]:
    """Split a GRES list at the commas outside parentheses."""
    items, depth, current = [], 0, []
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            items.append("".join(current))
            current = []
        else:
            current.append(ch)
    if current:
        items.append("".join(current))
    return [i.strip() for i in items if i.strip()]


def parse_indices(spec: str) -> list[int]:
    """`0-1,4` -> [0, 1, 4]; `N/A` or empty -> []."""
    out: list[int] = []
    for part in spec.split(","):
        part = part.strip()
        if not part or part == "N/A":
            continue
        if "-" in part:
            lo, hi = part.split("-", 1)
            out.extend(range(int(lo), int(hi) + 1))
        else:
            out.append(int(part))
    return out


@dataclass(frozen=True)
class Gres:
    name: str
    type: str
    count: int
    indices: tuple[int, ...] = ()


def parse_gres(text: str) -> list[Gres]:
    """`gpu:h800:8(S:0)`, `gpu:h800:2(IDX:0-1)`, `gpu:2` -> typed GRES items (GPUs and others)."""
    out = []
    for item in split_gres(text or ""):
        m = _GRES_ITEM.fullmatch(item)
        if m is None:
            continue
        type_, count = m.group("type"), m.group("count")
        if count is None and type_ is not None and type_.isdigit():
            type_, count = None, type_
        indices: tuple[int, ...] = ()
        extra = m.group("extra") or ""
        if extra.startswith("IDX:"):
            indices = tuple(parse_indices(extra[4:]))
        out.append(Gres(m.group("name"), type_ or "", int(count) if count else 1, indices))
    return out


@dataclass(frozen=True)
class SlurmNode:
    name: str
    state: str  # base state, lower case: idle, mixed, allocated, down, ...
    flags: frozenset[str]
    gpu_type: str
    gpus: int
    used_indices: frozenset[int]
    zone: str
    reason: str
    partitions: tuple[str, ...]

    @property
    def drained(self) -> bool:
        return bool(self.flags & DRAIN_FLAGS)

    @property
    def powered_off(self) -> bool:
        return bool(self.flags & POWER_OFF_FLAGS)

    @property
    def powering_up(self) -> bool:
        return bool(self.flags & POWERING_UP_FLAGS)

    @property
    def unknown_condition(self) -> str | None:
        """Why the adapter will not act on this node (a state it does not know), or None."""
        if self.state not in KNOWN_BASE_STATES:
            if self.powered_off and self.state == "down" and "NOT_RESPONDING" not in self.flags:
                return None
            return f"state {self.state.upper()}" + (f" ({self.reason})" if self.reason else "")
        bad = self.flags & UNHEALTHY_FLAGS
        if bad and not (self.powered_off or self.powering_up):
            return f"flags {'+'.join(sorted(bad))}" + (f" ({self.reason})" if self.reason else "")
        return None


def _zone(features: str) -> str:
    for feature in (features or "").split(","):
        if feature.startswith(ZONE_FEATURE_PREFIX):
            return feature[len(ZONE_FEATURE_PREFIX) :]
    return ""


def parse_node(raw: Mapping[str, Any]) -> SlurmNode:
    gpus = [g for g in parse_gres(str(raw.get("gres", ""))) if g.name == "gpu"]
    used = [g for g in parse_gres(str(raw.get("gres_used", ""))) if g.name == "gpu"]
    state, flags = _state(raw.get("state", "unknown"))
    return SlurmNode(
        name=str(raw["name"]),
        state=(state or "unknown").lower(),
        flags=flags | frozenset(str(f).upper() for f in raw.get("state_flags") or ()),
        gpu_type=gpus[0].type if gpus else "",
        gpus=sum(g.count for g in gpus),
        used_indices=frozenset(i for g in used for i in g.indices),
        zone=_zone(_text(raw.get("active_features") or raw.get("features"), "active")),
        reason=str(raw.get("reason") or ""),
        partitions=tuple(raw.get("partitions") or ()),
    )


def parse_nodes(raw: Iterable[Mapping[str, Any]]) -> list[SlurmNode]:
    return sorted((parse_node(n) for n in raw), key=lambda n: n.name)


def parse_comment(comment: str) -> dict[str, str]:
    """A job comment `kind=training;checkpoint=3` -> {'kind': 'training', 'checkpoint': '3'}."""
    out = {}
    for part in re.split(r"[;,\s]+", comment or ""):
        if "=" in part:
            key, value = part.split("=", 1)
            out[key.strip()] = value.strip()
    return out


@dataclass(frozen=True)
class SlurmJob:
    job_id: str
    name: str
    state: str  # RUNNING, PENDING, COMPLETING, ...
    node: str
    account: str
    partition: str
    qos: str
    start_time: datetime | None
    end_time: datetime | None
    requeue: bool
    restarts: int
    gpu_type: str
    gpu_indices: tuple[int, ...]
    comment: dict[str, str]
    # what the job asks for (a pending job holds nothing yet): GPUs in all, their GRES type
    # ("" where the request names none), on how many nodes, when it was submitted, and why a
    # pending job waits (squeue's reason)
    requested_gpus: int = 0
    requested_gpu_type: str = ""
    submit_time: datetime | None = None
    requested_nodes: int = 1
    state_reason: str = ""
    # when a pending job may start (its begin time; squeue's `eligible_time`, None where unset)
    eligible_time: datetime | None = None

    @property
    def waits_for_capacity(self) -> bool:
        """Pending for free resources or jobs ahead of it (`CAPACITY_REASONS`), not held,
        nor waiting on a dependency, a begin time or a limit of its account. A begin time
        still ahead counts whatever the reason says: right after `scontrol update
        StartTime=...` squeue reports the reason `None` until the scheduler's next pass."""
        reason = self.state_reason
        return (
            self.state == "PENDING"
            and (not reason or reason.startswith(CAPACITY_REASONS))
            and not self.deferred_at(datetime.now(timezone.utc))
        )

    def deferred_at(self, now: datetime) -> bool:
        """Whether a begin time keeps the job from starting at `now`."""
        return self.eligible_time is not None and self.eligible_time > now

    @property
    def gpu_ids(self) -> tuple[str, ...]:
        return tuple(gpu_id(self.node, i) for i in self.gpu_indices)

    @property
    def holds_gpus(self) -> bool:
        return self.state in HOLDING_JOB_STATES


def _time(value: Any) -> datetime | None:
    seconds = _number(value)
    return datetime.fromtimestamp(seconds, timezone.utc) if seconds is not None and seconds > 0 else None


def requested_gpus(raw: Mapping[str, Any]) -> tuple[int, str]:
    """(GPUs, GRES type) a job asks for: `tres_per_job`, else `tres_per_node` times its node
    count. Slurm writes `gres:gpu:a100:2` (22.05) or `gres/gpu:a100:2` (23.02 on); a request
    without a type is `gres:gpu:2`."""
    per_job = _gpu_request(str(raw.get("tres_per_job") or ""))
    if per_job is not None:
        return per_job
    per_node = _gpu_request(str(raw.get("tres_per_node") or ""))
    if per_node is None:
        return 0, ""
    return per_node[0] * node_count(raw), per_node[1]


def node_count(raw: Mapping[str, Any]) -> int:
    """How many nodes a job asks for (`node_count`; 23.02 on: {"number": n}), at least 1."""
    return max(_number(raw.get("node_count")) or 1, 1)


def _gpu_request(text: str) -> tuple[int, str] | None:
    """(GPUs, type) of the GPU items of a TRES request (`gres:gpu:a100:2`, `gres/gpu:2`)."""
    for item in split_gres(text):
        for prefix in ("gres:", "gres/"):
            item = item.removeprefix(prefix)
        found = [g for g in parse_gres(item.replace("=", ":")) if g.name == "gpu"]
        if found:
            return sum(g.count for g in found), found[0].type
    return None


def parse_squeue_job(raw: Mapping[str, Any]) -> SlurmJob:
    detail = [g for item in raw.get("gres_detail") or () for g in parse_gres(str(item)) if g.name == "gpu"]
    asked, asked_type = requested_gpus(raw)
    return SlurmJob(
        job_id=str(raw["job_id"]),
        name=str(raw.get("name") or ""),
        state=_state(raw.get("job_state") or "")[0].upper(),
        node=str(raw.get("nodes") or ""),
        account=str(raw.get("account") or ""),
        partition=str(raw.get("partition") or ""),
        qos=str(raw.get("qos") or ""),
        start_time=_time(raw.get("start_time")),
        end_time=_time(raw.get("end_time")),
        requeue=bool(raw.get("requeue")),
        restarts=_number(raw.get("restart_cnt")) or 0,
        gpu_type=detail[0].type if detail else "",
        gpu_indices=tuple(i for g in detail for i in g.indices),
        comment=parse_comment(_text(raw.get("comment"))),
        requested_gpus=asked,
        requested_gpu_type=asked_type,
        submit_time=_time(raw.get("submit_time")),
        requested_nodes=node_count(raw),
        state_reason=str(raw.get("state_reason") or ""),
        eligible_time=_time(raw.get("eligible_time")),
    )


def parse_squeue(raw: Iterable[Mapping[str, Any]]) -> list[SlurmJob]:
    return [parse_squeue_job(j) for j in raw]


_KV = re.compile(r"(\S+?)=(\S*)")


def parse_kv_line(line: str) -> dict[str, str]:
    """One `scontrol -o` or job completion log record: `Key=Value Key=Value ...`."""
    return {m.group(1): m.group(2) for m in _KV.finditer(line)}


def _iso(value: str) -> datetime | None:
    if not value or value in {"Unknown", "None", "N/A"}:
        return None
    try:
        return datetime.fromisoformat(value).astimezone(timezone.utc)
    except ValueError:
        return None


@dataclass(frozen=True)
class JobRun:
    """One run of a job as the job completion log records it (a requeued job has several)."""

    job_id: str
    state: str  # COMPLETED, CANCELLED, FAILED, PENDING (requeued), NODE_FAIL, TIMEOUT, ...
    account: str
    partition: str
    node: str
    start: datetime
    end: datetime
    gpus: int = 0  # GPUs allocated (sacct's TRES gres/gpu; the completion log does not say)

    @property
    def seconds(self) -> float:
        return max(0.0, (self.end - self.start).total_seconds())


def parse_config(text: str) -> dict[str, str]:
    """`scontrol show config`: `Key    = Value` lines."""
    out = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip() and " " not in key.strip():
            out[key.strip()] = value.strip()
    return out


def parse_jobcomp(lines: Iterable[str]) -> list[JobRun]:
    """The `jobcomp/filetxt` log: one line per ended run; lines without a start are skipped
    (a job cancelled while pending never ran). A run logged twice (cancelled, then requeued)
    counts once, with its first record's state."""
    runs = []
    seen: set[tuple[str, datetime]] = set()
    for line in lines:
        kv = parse_kv_line(line)
        start, end = _iso(kv.get("StartTime", "")), _iso(kv.get("EndTime", ""))
        if "JobId" not in kv or start is None or end is None or end < start:
            continue
        if (kv["JobId"], start) in seen:
            continue
        seen.add((kv["JobId"], start))
        runs.append(
            JobRun(
                job_id=kv["JobId"],
                state=kv.get("JobState", "").upper(),
                account=kv.get("Account", ""),
                partition=kv.get("Partition", ""),
                node=kv.get("NodeList", ""),
                start=start,
                end=end,
            )
        )
    return runs


def allocated_gpus(tres: Any) -> int:
    """GPUs in a job's allocated TRES (`gres/gpu`, any type): sacct's per-job GPU accounting."""
    if not isinstance(tres, dict):
        return 0
    return sum(
        int(t.get("count") or 0)
        for t in tres.get("allocated") or []
        if isinstance(t, dict) and t.get("type") == "gres" and t.get("name") == "gpu"
    )


def parse_sacct(jobs: Iterable[Any]) -> list[JobRun]:
    """`sacct --json --duplicates`: one ended run per record (a requeued job's earlier runs
    read REQUEUED); runs still going or that never started are skipped."""
    runs = []
    seen: set[tuple[str, datetime]] = set()
    for job in jobs:
        if not isinstance(job, dict) or "job_id" not in job:
            continue
        times = job.get("time") if isinstance(job.get("time"), dict) else {}
        start, end = _time(times.get("start")), _time(times.get("end"))
        state = job.get("state") if isinstance(job.get("state"), dict) else {}
        current = _state(state.get("current", ""))[0].upper()
        if start is None or end is None or end < start or current in {"RUNNING", "PENDING"}:
            continue
        key = (str(job["job_id"]), start)
        if key in seen:
            continue
        seen.add(key)
        runs.append(
            JobRun(
                job_id=str(job["job_id"]),
                state=current,
                account=str(job.get("account") or ""),
                partition=str(job.get("partition") or ""),
                node=str(job.get("nodes") or ""),
                start=start,
                end=end,
                gpus=allocated_gpus(job.get("tres")),
            )
        )
    return runs
