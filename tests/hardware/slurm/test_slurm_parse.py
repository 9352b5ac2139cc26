"""The slurm backend's readers and error classes on what Slurm prints, 22.05 and the JSON of 23.02 on (no daemons)."""

from __future__ import annotations

import time
from datetime import datetime, timezone

from market_pipeline.hardware.slurm.client import SlurmNotFound, SlurmUnavailable, classify
from market_pipeline.hardware.slurm.parse import (
    parse_gres,
    parse_jobcomp,
    parse_node,
    parse_sacct,
    parse_squeue_job,
    requested_gpus,
)


def test_gres_with_indices_names_each_gpu_by_node_and_index() -> None:
    [gres] = parse_gres("gpu:h800:3(IDX:0-1,5)")
    assert (gres.type, gres.count, gres.indices) == ("h800", 3, (0, 1, 5))
    assert parse_gres("gpu:a100_80gb:0(IDX:N/A)")[0].indices == ()
    assert [g.count for g in parse_gres("gpu:2,shard:h800:4(S:0)")] == [2, 4]


def _node(**overrides: object) -> dict:
    raw = {
        "name": "node3",
        "state": "mixed",
        "state_flags": [],
        "gres": "gpu:h800:8",
        "gres_used": "gpu:h800:2(IDX:0-1)",
        "active_features": "zone_cn-beijing-b",
        "reason": "",
        "partitions": ["guaranteed", "drainable"],
    }
    return raw | overrides


def test_node_pool_comes_from_gres_type_and_zone_feature() -> None:
    node = parse_node(_node())
    assert (node.gpu_type, node.gpus, node.zone, node.used_indices) == ("h800", 8, "cn-beijing-b", {0, 1})
    assert node.unknown_condition is None and not node.drained


def test_down_and_failing_nodes_are_reported_not_acted_on() -> None:
    assert parse_node(_node(state="down", reason="dead")).unknown_condition == "state DOWN (dead)"
    assert "NOT_RESPONDING" in parse_node(_node(state_flags=["NOT_RESPONDING"])).unknown_condition
    assert "FAIL" in parse_node(_node(state_flags=["FAIL"])).unknown_condition
    # a node powered down by power saving is known: off, not broken
    off = parse_node(_node(state="idle", state_flags=["POWERED_DOWN"]))
    assert off.powered_off and off.unknown_condition is None
    assert parse_node(_node(state_flags=["DRAIN"])).drained


def _running_job(**overrides: object) -> dict:
    """A running job as `squeue --json` (22.05) prints it: the fields the backend reads."""
    raw = {
        "job_id": 42,
        "job_state": "RUNNING",
        "nodes": "node3",
        "account": "acme-research",
        "partition": "drainable",
        "start_time": 1796411686,
        "requeue": True,
        "gres_detail": ["gpu:h800:2(IDX:4-5)"],
        "comment": "kind=training;checkpoint=3",
    }
    return raw | overrides


def test_running_job_carries_tenant_gpus_class_and_checkpoint_count() -> None:
    job = parse_squeue_job(_running_job())
    assert job.gpu_ids == ("node3:gpu4", "node3:gpu5")
    assert job.account == "acme-research" and job.requeue and job.holds_gpus
    assert job.comment == {"kind": "training", "checkpoint": "3"}
    assert job.start_time == datetime.fromtimestamp(1796411686, timezone.utc)


def test_jobcomp_counts_a_cancelled_then_requeued_run_once() -> None:
    line = (
        "JobId=11 UserId=root(0) Name=mp JobState={state} Partition=drainable "
        "StartTime=2026-12-04T19:22:53 EndTime=2026-12-04T19:22:55 NodeList=node3 Account=acme"
    )
    pending = "JobId=12 JobState=CANCELLED StartTime=Unknown EndTime=2026-12-04T19:22:55"
    runs = parse_jobcomp([line.format(state="CANCELLED"), line.format(state="PENDING"), pending])
    assert [(r.job_id, r.state, r.seconds) for r in runs] == [("11", "CANCELLED", 2.0)]


def _sacct_job(job_id: int, state: str, start: int, end: int, gpus: int | None) -> dict:
    """A job as `sacct --json` (22.05) prints it: the fields the backend reads."""
    tres = [{"type": "cpu", "name": None, "id": 1, "count": 1}]
    if gpus is not None:
        tres.append({"type": "gres", "name": "gpu", "id": 1001, "count": gpus})
    return {
        "job_id": job_id,
        "account": "acme-research",
        "partition": "drainable",
        "nodes": "node3",
        "state": {"current": state, "reason": "None"},
        "time": {"elapsed": max(end - start, 0), "start": start, "end": end, "submission": start},
        "tres": {"allocated": tres, "requested": tres},
    }


def test_sacct_reads_each_ended_run_with_its_gpus_and_skips_what_still_runs() -> None:
    jobs = [
        _sacct_job(21, "REQUEUED", 1796434000, 1796434010, 2),  # the drained run of a requeued job
        _sacct_job(21, "COMPLETED", 1796434030, 1796434034, 2),  # its second run
        _sacct_job(22, "RUNNING", 1796434020, 0, 1),
        _sacct_job(23, "CANCELLED", 0, 1796434011, None),  # cancelled while pending: never ran
        _sacct_job(24, "FAILED", 1796434000, 1796434001, None),  # a job without GPUs
    ]
    runs = parse_sacct([*jobs, jobs[0], "not a job"])
    assert [(r.job_id, r.state, r.seconds, r.gpus) for r in runs] == [
        ("21", "REQUEUED", 10.0, 2),
        ("21", "COMPLETED", 4.0, 2),
        ("24", "FAILED", 1.0, 0),
    ]
    assert (
        runs[0].start == datetime.fromtimestamp(1796434000, timezone.utc)
        and runs[0].account == "acme-research"
    )


def test_errors_name_munge_or_slurmctld_or_a_vanished_job() -> None:
    munge = classify(
        "sinfo --json",
        1,
        "sinfo: error: If munged is up, restart with --num-threads=10\n"
        'sinfo: error: Munge encode failed: Failed to access "/x/munge.socket": No such file\n'
        "Unspecified error",
    )
    assert isinstance(munge, SlurmUnavailable) and "munge is unreachable (sinfo: error: Munge encode" in str(
        munge
    )
    ctld = classify(
        "scontrol update", 1, "slurm_load_node error: Unable to contact slurm controller (connect failure)"
    )
    assert isinstance(ctld, SlurmUnavailable) and "slurmctld is unreachable" in str(ctld)
    gone = classify(
        "scancel --signal=USR1", 1, "scancel: error: Kill job error on job id 99: Invalid job id specified"
    )
    assert isinstance(gone, SlurmNotFound)


def test_sample_log_reads_a_window_and_stays_bounded(tmp_path) -> None:  # noqa: ANN001
    from datetime import timedelta

    from market_pipeline.hardware.slurm.samples import SampleLog

    log = SampleLog(tmp_path / "s.jsonl", interval_seconds=60, max_bytes=4000)
    t0 = datetime(2026, 12, 4, 19, 0, tzinfo=timezone.utc)
    assert log.due(t0)
    for minute in range(40):
        row = {
            "ts": t0 + timedelta(minutes=minute),
            "node_id": "node1",
            "gpu_uuid": "node1:gpu0",
            "gpu_index": 0,
        }
        log.append([row | {"sm_util_pct": 100.0, "mem_total_mib": 81920.0, "xid_errors": 0}])
    assert not log.due(t0 + timedelta(minutes=39, seconds=30)) and log.due(t0 + timedelta(minutes=40))
    assert (tmp_path / "s.jsonl").stat().st_size <= 4000 + 300  # cut to its newer half past the bound
    window = log.read(t0 + timedelta(minutes=30), t0 + timedelta(minutes=35))
    assert window["ts"].to_list() == [t0 + timedelta(minutes=m) for m in range(30, 35)]


def test_a_jobs_gpu_request_reads_either_slurm_release_and_its_node_count() -> None:
    """A pending job holds no GPUs yet: what it asks for is in `tres_per_node` (times its
    nodes) or `tres_per_job`, written `gres:gpu:...` by 22.05 and `gres/gpu:...` from 23.02."""
    assert requested_gpus({"tres_per_node": "gres:gpu:a100_80gb:2", "node_count": 1}) == (2, "a100_80gb")
    assert requested_gpus({"tres_per_node": "gres/gpu:3", "node_count": {"number": 2}}) == (6, "")
    assert requested_gpus({"tres_per_job": "gres/gpu:h800:4", "tres_per_node": "gres/gpu:1"}) == (4, "h800")
    assert requested_gpus({"tres_per_node": "gres:shard:2"}) == (0, "")  # not a GPU request
    assert requested_gpus({}) == (0, "")
    job = parse_squeue_job(
        {"job_id": 7, "job_state": "PENDING", "tres_per_node": "gres:gpu:h800:1", "submit_time": 1796597613}
    )
    assert (job.requested_gpus, job.requested_gpu_type, job.gpu_indices) == (1, "h800", ())
    assert job.submit_time is not None and job.submit_time.year == 2026


def _newer(value: int) -> dict:
    """A time or count as Slurm writes it from 23.02 on."""
    return {"set": True, "infinite": False, "number": value}


def test_the_json_of_slurm_23_02_on_reads_as_22_05s() -> None:
    """From 23.02 a state is a list (base state first, its flags after), a time or count is
    `{"set": ..., "number": N}`, a job's comment is `{"job": ...}` and a node's features are
    lists: each record reads as the same record in 22.05's JSON does."""
    extra = {"submit_time": 1796411600, "restart_cnt": 1, "tres_per_node": "gres:gpu:h800:2", "node_count": 1}
    old = parse_squeue_job(_running_job(**extra))
    new = parse_squeue_job(
        _running_job(
            job_state=["RUNNING"],
            start_time=_newer(1796411686),
            submit_time=_newer(1796411600),
            restart_cnt=_newer(1),
            comment={"administrator": "", "job": "kind=training;checkpoint=3", "system": ""},
            tres_per_node="gres/gpu:h800:2",
            node_count=_newer(1),
        )
    )
    assert new == old and new.holds_gpus and new.restarts == 1 and new.comment["checkpoint"] == "3"
    assert parse_squeue_job({"job_id": 1, "start_time": {"set": False, "number": 0}}).start_time is None
    node = parse_node(
        _node(state=["IDLE", "DRAIN", "POWERED_DOWN"], active_features=["zone_cn-beijing-b", "nvlink"])
        | {"state_flags": None}
    )
    assert (node.state, node.zone, node.drained, node.powered_off) == ("idle", "cn-beijing-b", True, True)
    assert parse_node(_node(state=["DOWN", "NOT_RESPONDING"])).unknown_condition == "state DOWN"
    newer_sacct = _sacct_job(21, "COMPLETED", 1796434030, 1796434034, 2)
    newer_sacct["state"]["current"] = ["COMPLETED"]
    newer_sacct["time"] |= {"start": _newer(1796434030), "end": _newer(1796434034)}
    [run] = parse_sacct([newer_sacct])
    assert (run.state, run.seconds, run.gpus) == ("COMPLETED", 4.0, 2)


def test_a_pending_job_waits_for_capacity_only_for_resources_or_the_jobs_ahead() -> None:
    """Resources, priority, nodes unavailable, or no reason yet (not tried by the scheduler):
    a drain could start it. Held, a dependency, a begin time or an account limit: none could."""

    def pending(reason: str, **extra: object) -> bool:
        raw = {"job_id": 7, "job_state": ["PENDING"], "state_reason": reason} | extra
        return parse_squeue_job(raw).waits_for_capacity

    for reason in ("Resources", "Priority", "ReqNodeNotAvail, UnavailableNodes:node[1-2]", "None", ""):
        assert pending(reason), reason
    for reason in (
        "JobHeldUser",
        "JobHeldAdmin",
        "Dependency",
        "BeginTime",
        "AssocGrpGRES",
        "QOSMaxGRESPerUser",
    ):
        assert not pending(reason), reason
    # a begin time ahead: not yet eligible, whatever the reason says (right after `scontrol
    # update StartTime=` squeue still reports `None`); one passed: eligible, in either dialect
    ahead = int(time.time()) + 600
    assert not pending("None", eligible_time=ahead) and not pending("Resources", eligible_time=_newer(ahead))
    assert pending("Resources", eligible_time=int(time.time()) - 60)
    assert parse_squeue_job(
        {"job_id": 7, "eligible_time": _newer(ahead)}
    ).eligible_time == datetime.fromtimestamp(ahead, timezone.utc)
    running = parse_squeue_job({"job_id": 8, "job_state": "RUNNING", "state_reason": "None"})
    assert not running.waits_for_capacity
    job = parse_squeue_job({"job_id": 9, "tres_per_node": "gres/gpu:a100:4", "node_count": _newer(3)})
    assert (job.requested_gpus, job.requested_nodes) == (12, 3)


def test_the_nodes_come_from_sinfo_or_where_it_prints_groups_from_scontrol() -> None:
    """22.05 and 23.02 list every node in `sinfo --json`'s "nodes"; from 23.11 sinfo prints
    groups of nodes ("sinfo"), and the records are `scontrol --json show nodes`'."""
    from market_pipeline.hardware.slurm.client import SlurmClient

    class Replies(SlurmClient):
        def __init__(self, replies: dict[str, dict]) -> None:
            super().__init__(None)
            self.replies, self.asked = replies, []

        def run_json(self, argv):  # noqa: ANN001, ANN202
            self.asked.append(argv[0])
            return self.replies[argv[0]]

    nodes = [_node() | {"state": ["MIXED"], "state_flags": None}]
    older = Replies({"sinfo": {"nodes": nodes}})
    assert older.sinfo_nodes() == nodes and older.asked == ["sinfo"]
    newer = Replies({"sinfo": {"sinfo": [{"nodes": {"nodes": ["node3"]}}]}, "scontrol": {"nodes": nodes}})
    assert newer.sinfo_nodes() == nodes and newer.asked == ["sinfo", "scontrol"]
    assert parse_node(newer.sinfo_nodes()[0]).state == "mixed"
