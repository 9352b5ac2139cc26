"""Rule 6 of the rigid guarantee on a backend that starts work itself (`drain.queue_rules`): the
nodes kept from new drainable work, picked by the shared policy on the fleet's inventory."""

from __future__ import annotations

import dataclasses
from datetime import timedelta

import pytest
from drain_testkit import T0, make_task

from market_pipeline.config import MarketPipelineConfig, load_config
from market_pipeline.drain.queue_rules import (
    inventory_capacity,
    keep_off_drainable,
    kept_for_arrivals,
    whole_node_stock,
)
from market_pipeline.hardware.protocol import (
    DrainableKeptOff,
    GpuInfo,
    GuaranteedArrival,
    NodeInfo,
    NodeState,
    ResourceClass,
    TaskInfo,
)
from market_pipeline.hardware.slurm.client import SlurmNotFound, parse_partition_nodes

GUARANTEE = load_config().guardrails.rigid_guarantee


def kept_for_whole_node_work(nodes, gpus, tasks, guarantee) -> tuple[str, ...]:  # noqa: ANN001
    """Rule 6's nodes on an inventory, by id."""
    cap, guaranteed = inventory_capacity(nodes, gpus, tasks)
    return tuple(cap.node_ids[i] for i in whole_node_stock(cap, guaranteed, guarantee).nonzero()[0])


def fleet(n: int, gpus: int = 8, model: str = "A100-80GB") -> tuple[list[NodeInfo], list[GpuInfo]]:
    nodes = [NodeInfo(f"{model}-{i:02d}", "p1", model, "z1", gpus, NodeState.ON) for i in range(n)]
    return nodes, [
        GpuInfo(f"{x.node_id}/{g}", x.node_id, g, model, 81920) for x in nodes for g in range(gpus)
    ]


def task(
    node: str, first: int, count: int, cls: ResourceClass = ResourceClass.DRAINABLE, milli: int = 1000
) -> TaskInfo:
    """A task on `count` GPUs of `node` from slot `first` (their ids as `fleet` names them)."""
    held = tuple(f"{node}/{g}" for g in range(first, first + count))
    return dataclasses.replace(
        make_task(f"{node}:{first}", node=node, gpu_milli=milli, resource_class=cls), gpu_uuids=held
    )


def test_the_last_empty_largest_node_is_kept_and_more_empty_ones_keep_none() -> None:
    """Ten 8-GPU nodes keep one empty node (one per ten largest). While two are empty,
    drainable work may take either (none is kept); once one is left, that one is kept."""
    nodes, gpus = fleet(10)
    busy = [task(n.node_id, 0, 1) for n in nodes[:8]]  # every node but the last two shares a GPU
    assert kept_for_whole_node_work(nodes, gpus, busy, GUARANTEE) == ()
    busy.append(task(nodes[8].node_id, 3, 1, milli=250))  # a quarter of one GPU: not empty any more
    assert kept_for_whole_node_work(nodes, gpus, busy, GUARANTEE) == (nodes[9].node_id,)
    assert kept_for_whole_node_work(nodes[:9], gpus, busy, GUARANTEE) == ()  # nine nodes keep none
    off = GUARANTEE.model_copy(update={"empty_nodes_kept": 0})
    assert kept_for_whole_node_work(nodes, gpus, busy, off) == ()


def test_with_no_empty_node_the_refill_is_the_nearest_to_empty_without_guaranteed_work() -> None:
    """No empty node: the refill keeps the node with the most free GPUs, passing over one that
    runs guaranteed work (its jobs do not end by a drain) and one that is cordoned."""
    nodes, gpus = fleet(10)
    tasks = [task(n.node_id, 0, 7) for n in nodes]
    tasks.append(task(nodes[3].node_id, 7, 1))  # node 3 full
    tasks[5] = task(nodes[5].node_id, 0, 2)  # 6 free, but guaranteed work runs there
    tasks.append(task(nodes[5].node_id, 2, 1, ResourceClass.GUARANTEED))
    tasks[6] = task(nodes[6].node_id, 0, 4)  # 4 free: the refill
    tasks[7] = task(nodes[7].node_id, 0, 1)  # 7 free, but cordoned
    nodes[7] = dataclasses.replace(nodes[7], cordoned=True)
    assert kept_for_whole_node_work(nodes, gpus, tasks, GUARANTEE) == (nodes[6].node_id,)
    no_refill = GUARANTEE.model_copy(update={"refill_empty_nodes": False})
    assert kept_for_whole_node_work(nodes, gpus, tasks, no_refill) == ()


def test_the_inventory_reads_each_gpu_held_and_nodes_without_gpus_are_left_out() -> None:
    nodes, gpus = fleet(2, gpus=4)
    nodes.append(NodeInfo("cpu-00", "cpu", "", "z1", 0, NodeState.ON))
    tasks = [task(nodes[0].node_id, 1, 2, milli=500), task(nodes[1].node_id, 0, 1, ResourceClass.GUARANTEED)]
    cap, guaranteed = inventory_capacity(nodes, gpus, tasks)
    assert cap.node_ids == (nodes[0].node_id, nodes[1].node_id)
    assert cap.gpu_free.tolist() == [[1000, 500, 500, 1000], [0, 1000, 1000, 1000]]
    assert guaranteed.tolist() == [False, True]


def test_the_forecast_arrivals_keep_the_node_they_would_fit_best() -> None:
    """Rule 5 on an inventory: four guaranteed 2-GPU arrivals in the last four hours expect one
    within the 10-minute SLA wait (4 x 600 / 14,400, rounded up), placed best fit: the node
    with the fewest free GPUs that still fits two, of the model they ask for. Arrivals older
    than the window expect nothing; a model no node has keeps nothing."""
    a100, a100_gpus = fleet(3)
    h800, h800_gpus = fleet(1, model="H800")
    nodes, gpus = a100 + h800, a100_gpus + h800_gpus
    tasks = [task(a100[0].node_id, 0, 7), task(a100[1].node_id, 0, 6), task(a100[2].node_id, 0, 4)]
    cap, _ = inventory_capacity(nodes, gpus, tasks)

    def arrivals(model: str, hours_ago: float, count: int = 4) -> list[GuaranteedArrival]:
        return [
            GuaranteedArrival(f"j{i}", T0 - timedelta(hours=hours_ago, minutes=i), model, 2)
            for i in range(count)
        ]

    kept = kept_for_arrivals(cap, arrivals("A100-80GB", 1), T0, 4 * 3600, 600)
    assert [cap.node_ids[i] for i in kept.nonzero()[0]] == [a100[1].node_id]  # 2 free: the best fit
    assert not kept_for_arrivals(cap, arrivals("A100-80GB", 5), T0, 4 * 3600, 600).any()
    assert not kept_for_arrivals(cap, arrivals("A100-80GB", 1), T0, 0, 600).any()
    kept = kept_for_arrivals(cap, arrivals("H800", 1), T0, 4 * 3600, 600)
    assert [cap.node_ids[i] for i in kept.nonzero()[0]] == [h800[0].node_id]
    assert not kept_for_arrivals(cap, arrivals("B200", 1), T0, 4 * 3600, 600).any()
    # two nodes a job asks count as two arrivals: 8 x 600 / 14,400 rounds up to one still
    many = [dataclasses.replace(a, nodes=2) for a in arrivals("A100-80GB", 1)]
    assert kept_for_arrivals(cap, many, T0, 4 * 3600, 600).sum() == 1
    assert kept_for_arrivals(cap, many * 4, T0, 4 * 3600, 1800).sum() == 3  # 32 x 1800 / 14,400 = 4 expected


def test_the_pass_hands_the_backend_its_nodes_or_says_nothing_where_it_has_no_queue() -> None:
    """Shadow mode asks without acting; the rule off asks with no node (the backend gives back
    what it kept); a backend without the method (the twin, local processes) gets no pass."""
    nodes, gpus = fleet(10)
    tasks = [task(n.node_id, 0, 8) for n in nodes[:9]]

    class Queue:
        def __init__(self) -> None:
            self.calls: list[tuple[tuple[str, ...], bool]] = []

        def list_nodes(self) -> list[NodeInfo]:
            return nodes

        def list_gpus(self) -> list[GpuInfo]:
            return gpus

        def list_tasks(self) -> list[TaskInfo]:
            return tasks

        def keep_drainable_off(self, node_ids, *, act: bool) -> DrainableKeptOff:
            self.calls.append((tuple(node_ids), act))
            return DrainableKeptOff(tuple(node_ids))

    def config(**overrides: str) -> MarketPipelineConfig:
        return load_config(environ={f"MP__{k}": v for k, v in overrides.items()})

    queue = Queue()
    assert keep_off_drainable(queue, config()) == DrainableKeptOff((nodes[9].node_id,))
    keep_off_drainable(queue, config(LOOP__SHADOW_MODE="true"))
    keep_off_drainable(queue, config(GUARDRAILS__RIGID_GUARANTEE__ENABLED="false"))
    assert queue.calls == [((nodes[9].node_id,), True), ((nodes[9].node_id,), False), ((), True)]

    class Twin:
        def list_nodes(self) -> list[NodeInfo]:
            raise AssertionError("not read: the twin applies the rule in its own placement")

    assert keep_off_drainable(Twin(), config()) is None


def test_a_partitions_node_list_is_read_from_its_own_line() -> None:
    text = (
        "PartitionName=guaranteed AllowGroups=ALL AllocNodes=ALL Nodes=node[1-4] PriorityTier=2\n"
        "PartitionName=drainable AllowGroups=ALL AllocNodes=ALL Nodes=node[1-3],node5 PriorityTier=1\n"
        "PartitionName=empty AllocNodes=ALL Nodes=(null)\n"
    )
    assert parse_partition_nodes("drainable", text) == "node[1-3],node5"
    assert parse_partition_nodes("empty", text) == ""
    with pytest.raises(SlurmNotFound, match="partition preemptible does not exist"):
        parse_partition_nodes("preemptible", text)
