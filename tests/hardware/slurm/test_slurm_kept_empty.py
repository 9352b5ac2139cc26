"""Rule 6 of the rigid guarantee on real Slurm daemons: the empty nodes kept for whole-node
guaranteed work, and the nodes refilling them, take no new drainable work.

A local cluster of ten `A100-80GB` nodes of 2 GPUs (a model keeps one empty node per ten of
its largest nodes: fewer than ten keep none), started once for this module. Skipped, with the
reason, where the Slurm binaries are not installed (`.ci/run` installs them) or the suite does
not run as root (slurmd must).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone

import pytest
from test_slurm_cluster import (  # the one bounded poll of the Slurm tests
    NEEDS_SLURM,
    running_cluster,
    wait_for,
)

from market_pipeline.config import load_config
from market_pipeline.drain.queue_rules import keep_off_drainable
from market_pipeline.hardware.protocol import DrainableKeptOff
from market_pipeline.hardware.slurm.adapter import SlurmAdapter, split_task_id
from market_pipeline.hardware.slurm.cluster import (
    DRAINABLE_PARTITION,
    ClusterSpec,
    LocalCluster,
    NodeGroup,
)
from market_pipeline.hardware.slurm.workload import JobSpec, submit

pytestmark = NEEDS_SLURM
UTC = timezone.utc
NODES = 10


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    spec = ClusterSpec(groups=(NodeGroup("a100_80gb", "cn-hangzhou-a", NODES, 2, 4),), kill_wait_seconds=2)
    yield from running_cluster(tmp_path_factory, "slurm-kept", spec)


def running_on(adapter: SlurmAdapter) -> dict[str, str]:
    """job id -> the node it runs on."""
    return {split_task_id(t.task_id)[0]: t.node_id for t in adapter.list_tasks()}


def drainable_nodes(adapter: SlurmAdapter) -> set[str]:
    return {n.name for n in adapter.slurm_nodes() if DRAINABLE_PARTITION in n.partitions}


def cancel_all(cluster: LocalCluster, adapter: SlurmAdapter, ids: list[str]) -> None:
    client = cluster.client()
    for job_id in ids:
        client.cancel(job_id)
    wait_for(lambda: not adapter.list_tasks() or None, 30, "every job gone")


def test_the_last_empty_node_is_kept_for_whole_node_work_and_churn_refills_it(
    cluster: LocalCluster, adapter: SlurmAdapter, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Nine nodes run a drainable 2-GPU job each; the tenth is the model's last empty node.
    The pass (`drain.queue_rules.keep_off_drainable`, the `drain_requests` asset's) takes it
    out of the drainable partition: a drainable 1-GPU job submitted next does not start there
    (without the rule it would, at once), and a whole-node guaranteed job does. With no empty
    node left, the next pass keeps a node running no guaranteed work from new drainable work
    (the refill); once its job ends, the pending drainable job still does not take it: it is the
    kept empty node now. Turning the rule off gives the partition its list back, and
    the pending drainable job starts. (Rule 5, the room for the arrivals forecast, is off here:
    the next test has it.)"""
    monkeypatch.setenv("MP__GUARDRAILS__RIGID_GUARANTEE__FORECAST_WINDOW_MINUTES", "0")
    config = load_config()
    client, jobs = cluster.client(), cluster.home / "jobs"
    ids = submit(client, [JobSpec("acme-research", "a100_80gb", 2, 300, drainable=True)] * (NODES - 1), jobs)
    try:
        placed = wait_for(
            lambda: (r := running_on(adapter)).keys() >= set(ids) and r, 30, "nine jobs running"
        )
        [empty] = sorted({n.name for n in adapter.slurm_nodes()} - set(placed.values()))
        found = client.partition_nodes(DRAINABLE_PARTITION)  # `Nodes=ALL` in slurm.conf, as Slurm lists it
        assert found == f"node[1-{NODES}]"

        shadow = adapter.keep_drainable_off([empty], act=False)  # shadow mode: told, not done
        assert shadow == DrainableKeptOff(kept=(empty,))
        assert empty in drainable_nodes(adapter)

        kept = keep_off_drainable(adapter, config)
        assert kept == DrainableKeptOff(kept=(empty,)), kept
        assert drainable_nodes(adapter) == {n.name for n in adapter.slurm_nodes()} - {empty}
        assert keep_off_drainable(adapter, config) == kept  # the same list: nothing to change

        [queued] = submit(client, [JobSpec("ember-ai", "a100_80gb", 1, 300, drainable=True)], jobs)
        ids.append(queued)
        time.sleep(6)  # three of the scheduler's passes (sched_interval, bf_interval = 2 s)
        assert queued not in running_on(adapter)
        [rigid] = submit(client, [JobSpec("delta-vision", "a100_80gb", 2, 300, drainable=False)], jobs)
        ids.append(rigid)
        assert wait_for(lambda: running_on(adapter).get(rigid), 30, "the guaranteed job running") == empty

        # no empty node left: the refill keeps the first node with no guaranteed work off drainable work
        refill = keep_off_drainable(adapter, config)
        assert refill is not None and refill.returned == (empty,) and len(refill.kept) == 1, refill
        [refilling] = refill.kept
        assert refilling != empty and refilling not in drainable_nodes(adapter)
        [victim] = [job for job, node in running_on(adapter).items() if node == refilling]
        client.cancel(victim)
        wait_for(lambda: refilling not in running_on(adapter).values() or None, 30, "its job ending")
        time.sleep(6)
        assert queued not in running_on(adapter)
        assert keep_off_drainable(adapter, config) == DrainableKeptOff(kept=(refilling,))

        # the rule off: what it kept goes back, the partition's own definition with it
        monkeypatch.setenv("MP__GUARDRAILS__RIGID_GUARANTEE__EMPTY_NODES_KEPT", "0")
        off = keep_off_drainable(adapter, load_config())
        assert off == DrainableKeptOff(returned=(refilling,))
        assert client.partition_nodes(DRAINABLE_PARTITION) == found
        assert wait_for(lambda: running_on(adapter).get(queued), 30, "the drainable job running") == refilling
        assert keep_off_drainable(adapter, load_config()) == DrainableKeptOff()
    finally:
        cancel_all(cluster, adapter, ids)
        client.set_partition_nodes(DRAINABLE_PARTITION, "ALL")


def test_a_guaranteed_arrival_keeps_the_room_its_like_would_take_from_drainable_work(
    cluster: LocalCluster, adapter: SlurmAdapter
) -> None:
    """Rule 5 on real daemons. Eight nodes run a drainable 2-GPU job each, and a guaranteed
    1-GPU job arrives and starts on one of the two empty nodes. The forecast (one arrival in
    four hours, so one within the 10-minute SLA wait, of its shape) keeps the free GPU beside
    it, the best fit for a 1-GPU job, and rule 6 the last empty node: a drainable 1-GPU job
    submitted next starts on neither. The arrival is read from squeue at its submission, and
    that of a job squeue no longer lists from the journal's runs, at its start."""
    config = load_config()
    client, jobs = cluster.client(), cluster.home / "jobs"
    since = datetime.now(UTC) - timedelta(seconds=2)
    ids = submit(client, [JobSpec("acme-research", "a100_80gb", 2, 300, drainable=True)] * (NODES - 2), jobs)
    try:
        wait_for(lambda: running_on(adapter).keys() >= set(ids) or None, 30, "eight jobs running")
        [rigid] = submit(client, [JobSpec("delta-vision", "a100_80gb", 1, 300, drainable=False)], jobs)
        ids.append(rigid)
        beside = wait_for(lambda: running_on(adapter).get(rigid), 30, "the guaranteed job running")
        [arrival] = [a for a in adapter.guaranteed_arrivals(since) if a.job_id == rigid]
        assert (arrival.gpu_model, arrival.num_gpu, arrival.nodes) == ("A100-80GB", 1, 1)
        assert arrival.arrived_at >= since
        # a run the journal saw of a job squeue has forgotten (ended past MinJobAge) still arrived
        with adapter.journal.edit() as journal:
            [seen] = [r for r in journal["runs"].values() if r["task_id"].startswith(f"{rigid}@")]
            journal["runs"]["9999999@1"] = seen | {"task_id": "9999999@1"}
        forgotten = [a for a in adapter.guaranteed_arrivals(since) if a.job_id == "9999999"]
        assert [(a.gpu_model, a.num_gpu) for a in forgotten] == [("A100-80GB", 1)]
        assert not [
            a for a in adapter.guaranteed_arrivals(datetime.now(UTC)) if a.job_id in {rigid, "9999999"}
        ]

        [empty] = sorted({n.name for n in adapter.slurm_nodes()} - set(running_on(adapter).values()))
        kept = keep_off_drainable(adapter, config)
        assert kept is not None and set(kept.kept) == {beside, empty}, kept
        [queued] = submit(client, [JobSpec("ember-ai", "a100_80gb", 1, 300, drainable=True)], jobs)
        ids.append(queued)
        time.sleep(6)  # three of the scheduler's passes
        assert queued not in running_on(adapter)
    finally:
        adapter.keep_drainable_off([])  # the list as found, the journal cleared
        cancel_all(cluster, adapter, ids)


def test_a_model_keeps_one_of_its_largest_nodes_open_to_drainable_work(
    cluster: LocalCluster, adapter: SlurmAdapter
) -> None:
    """Asked to keep every node of the model, the pass keeps all but its last largest one in
    the drainable partition: sbatch accepts a drainable job of the model, and it runs there."""
    client = cluster.client()
    names = [n.name for n in adapter.slurm_nodes()]
    ids: list[str] = []
    try:
        assert adapter.keep_drainable_off(names) == DrainableKeptOff(kept=tuple(names[:-1]))
        assert drainable_nodes(adapter) == {names[-1]}
        ids += submit(
            client, [JobSpec("ember-ai", "a100_80gb", 2, 300, drainable=True)], cluster.home / "jobs"
        )
        assert wait_for(lambda: running_on(adapter).get(ids[0]), 30, "the drainable job running") == names[-1]
    finally:
        adapter.keep_drainable_off([])
        cancel_all(cluster, adapter, ids)


def test_a_partition_list_changed_since_is_the_operators_and_is_not_put_back(
    cluster: LocalCluster, adapter: SlurmAdapter
) -> None:
    """Where the drainable partition's list is no longer the one our pass set (an operator's
    `scontrol update`), the next pass takes theirs as the partition's own and does not restore
    the list it found before."""
    client = cluster.client()
    names = [n.name for n in adapter.slurm_nodes()]
    try:
        assert adapter.keep_drainable_off([names[-1]]).kept == (names[-1],)
        client.set_partition_nodes(DRAINABLE_PARTITION, ",".join(names[:5]))  # the operator's
        assert adapter.keep_drainable_off([]) == DrainableKeptOff()
        assert drainable_nodes(adapter) == set(names[:5])
    finally:
        client.set_partition_nodes(DRAINABLE_PARTITION, "ALL")


def test_shadow_mode_reports_what_it_would_keep_and_gives_back_what_was_kept(
    cluster: LocalCluster, adapter: SlurmAdapter
) -> None:
    """A loop switched to shadow mode leaves the cluster as it found it: the pass says which
    nodes it would keep, keeps none, and gives back those an acting pass kept."""
    client = cluster.client()
    names = [n.name for n in adapter.slurm_nodes()]
    found = client.partition_nodes(DRAINABLE_PARTITION)
    try:
        assert adapter.keep_drainable_off(names[:2]).kept == tuple(names[:2])
        assert drainable_nodes(adapter) == set(names[2:])
        shadow = adapter.keep_drainable_off(names[1:3], act=False)
        assert shadow == DrainableKeptOff(kept=tuple(names[1:3]), returned=tuple(names[:2]))
        assert client.partition_nodes(DRAINABLE_PARTITION) == found
        assert adapter.keep_drainable_off(names[1:3], act=False).returned == ()
    finally:
        client.set_partition_nodes(DRAINABLE_PARTITION, found)


def test_drainable_work_as_a_qos_is_one_line_and_nothing_is_changed(cluster: LocalCluster) -> None:
    """Where drainable work is a QOS, not a partition, no node list can keep it off a node:
    the pass says so in one line and changes nothing."""
    adapter = SlurmAdapter.for_cluster(cluster, load_config(), poll_seconds=0.1)
    adapter.drainable = "preemptible"
    refused = adapter.keep_drainable_off([adapter.slurm_nodes()[0].name])
    assert refused.kept == () and "not a Slurm partition (no partition preemptible)" in refused.refused
    assert cluster.client().partition_nodes(DRAINABLE_PARTITION) == f"node[1-{NODES}]"
