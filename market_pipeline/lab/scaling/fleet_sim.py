"""A minute-level fluid model of one pool's nodes for replaying demand through a scaler.

Demand is fluid GPUs. Running work stays on its node: when demand falls, jobs end across
the pool in proportion to what each node runs (so an unneeded node is rarely empty and has
to be drained); new work fills the most allocated schedulable nodes first. A cordoned node
keeps its work until its drain ends; then the work restarts in room on other nodes. Some
nodes hold a task that cannot be evicted for a while (`pin_probability`, `pin_minutes`):
every drain of such a node is blocked until the pin ends — the stuck-drain case.
"""

from __future__ import annotations

import datetime as dt
import random
from dataclasses import dataclass

from market_pipeline.scaling.types import POWERED_STATES, DrainStatus, NodeState, NodeView


@dataclass(frozen=True)
class FleetParams:
    node_gpus: int = 8
    max_nodes: int = 64
    warm_nodes: int = 1
    cold_delay_minutes: int = 8
    warm_delay_minutes: int = 1
    drain_minutes: int = 5
    pin_probability: float = 0.05
    pin_minutes: tuple[int, int] = (120, 1440)
    seed: int = 7


@dataclass
class SimNode:
    node_id: str
    state: NodeState
    gpus: int
    ready_at: int | None = None
    used: float = 0.0
    drain_ends_at: int | None = None
    drain_blocked: bool = False
    pinned_until: int = -1


@dataclass
class FleetCounters:
    migrated_gpus: float = 0.0
    drains_started: int = 0
    drains_blocked: int = 0
    node_power_changes: int = 0


class Fleet:
    def __init__(self, params: FleetParams, initial_nodes: int) -> None:
        if not 0 <= initial_nodes <= params.max_nodes:
            raise ValueError(
                f"initial_nodes: must be in [0, max_nodes={params.max_nodes}], got {initial_nodes}"
            )
        self.params = params
        self.rng = random.Random(params.seed)
        self.counters = FleetCounters()
        self.nodes: list[SimNode] = []
        for i in range(params.max_nodes):
            if i < initial_nodes:
                state = NodeState.ACTIVE
            elif i < initial_nodes + params.warm_nodes:
                state = NodeState.STANDBY
            else:
                state = NodeState.OFF
            self.nodes.append(SimNode(f"n{i:03d}", state, params.node_gpus))
        self._by_id = {node.node_id: node for node in self.nodes}

    # ---- time -------------------------------------------------------------------------
    def advance(self, minute: int) -> None:
        for node in self.nodes:
            if node.ready_at is None or node.ready_at > minute:
                continue
            if node.state is NodeState.BOOTING:
                node.state, node.ready_at = NodeState.ACTIVE, None
            elif node.state is NodeState.WARMING:
                node.state, node.ready_at = NodeState.STANDBY, None

    # ---- actions ----------------------------------------------------------------------
    def power_on_warm(self, node_id: str, minute: int) -> bool:
        node = self._by_id[node_id]
        if node.state is not NodeState.STANDBY:
            return False
        self._boot(node, minute + self.params.warm_delay_minutes)
        return True

    def power_on_cold(self, count: int, minute: int, to_standby: bool = False) -> int:
        """Boot up to `count` cold nodes into service (or, `to_standby`, into the warm pool)."""
        started = 0
        for node in self.nodes:
            if started >= count:
                break
            if node.state is NodeState.OFF:
                self._boot(node, minute + self.params.cold_delay_minutes)
                if to_standby:
                    node.state = NodeState.WARMING
                started += 1
        return started

    def cordon(self, node_id: str, minute: int) -> bool:
        node = self._by_id[node_id]
        if node.state is not NodeState.ACTIVE:
            return False
        node.state = NodeState.CORDONED
        node.drain_blocked = False
        if node.used > 0:
            self.counters.drains_started += 1
            if node.pinned_until < minute and self.rng.random() < self.params.pin_probability:
                node.pinned_until = minute + self.rng.randint(*self.params.pin_minutes)
            node.drain_blocked = node.pinned_until >= minute
            # a blocked drain is known at once (the task refuses eviction); a real one takes time
            node.drain_ends_at = minute + (1 if node.drain_blocked else self.params.drain_minutes)
            self.counters.drains_blocked += int(node.drain_blocked)
        else:
            node.drain_ends_at = minute
        return True

    def uncordon(self, node_id: str) -> bool:
        node = self._by_id[node_id]
        if node.state is not NodeState.CORDONED:
            return False
        node.state, node.drain_ends_at, node.drain_blocked = NodeState.ACTIVE, None, False
        return True

    def power_off(self, node_id: str, to_standby: bool) -> bool:
        node = self._by_id[node_id]
        if node.state not in (NodeState.CORDONED, NodeState.ACTIVE, NodeState.STANDBY):
            return False
        if node.state is NodeState.CORDONED and node.used > 0:
            self.counters.migrated_gpus += node.used  # its tasks restart elsewhere
        if node.state is not NodeState.STANDBY:
            self.counters.node_power_changes += 1
        node.state = NodeState.STANDBY if to_standby else NodeState.OFF
        node.used, node.drain_ends_at, node.drain_blocked = 0.0, None, False
        return True

    def _boot(self, node: SimNode, ready_at: int) -> None:
        node.state, node.ready_at, node.used = NodeState.BOOTING, ready_at, 0.0
        self.counters.node_power_changes += 1

    # ---- observation ------------------------------------------------------------------
    def drain_done(self, node: SimNode, minute: int) -> bool:
        return node.drain_ends_at is not None and node.drain_ends_at <= minute and not node.drain_blocked

    def drain_status(self, minute: int) -> dict[str, DrainStatus]:
        out = {}
        for node in self.nodes:
            if node.state is not NodeState.CORDONED or node.drain_ends_at is None:
                continue
            ended = node.drain_ends_at <= minute
            out[node.node_id] = DrainStatus(
                node_id=node.node_id,
                all_tasks_drained_or_migrated=ended and not node.drain_blocked,
                blocked=ended and node.drain_blocked,
                reason="a task refuses eviction" if node.drain_blocked else "",
            )
        return out

    def node_views(self, start: dt.datetime, minute: int) -> list[NodeView]:
        """Views of every node but the cold ones (the policy counts those from max_nodes)."""
        views = []
        for node in self.nodes:
            if node.state is NodeState.OFF:
                continue
            used = 0.0 if node.state is NodeState.CORDONED and self.drain_done(node, minute) else node.used
            ready = start + dt.timedelta(minutes=node.ready_at) if node.ready_at is not None else None
            views.append(NodeView(node.node_id, node.state, node.gpus, min(used, node.gpus), (), ready))
        return views

    def powered_gpus(self) -> int:
        return sum(n.gpus for n in self.nodes if n.state in POWERED_STATES)

    def standby_gpus(self) -> int:
        return sum(n.gpus for n in self.nodes if n.state is NodeState.STANDBY)

    def schedulable_gpus(self) -> int:
        return sum(n.gpus for n in self.nodes if n.state is NodeState.ACTIVE)

    def booting_gpus(self) -> int:
        return sum(n.gpus for n in self.nodes if n.state is NodeState.BOOTING)

    def count(self, state: NodeState) -> int:
        return sum(1 for n in self.nodes if n.state is state)

    # ---- placement --------------------------------------------------------------------
    def place(self, demand: float, minute: int) -> float:
        """Serve `demand` GPUs this minute; return the GPUs served.

        Tasks stay where they run: when demand falls, jobs end across the pool in
        proportion to what each node runs; new demand fills the most allocated schedulable
        nodes first. Tasks of a node whose drain ended restart elsewhere.
        """
        for node in self.nodes:
            if node.state is NodeState.CORDONED and self.drain_done(node, minute) and node.used > 0:
                self.counters.migrated_gpus += node.used
                node.used = 0.0
        holders = [n for n in self.nodes if n.state in (NodeState.ACTIVE, NodeState.CORDONED)]
        running = sum(n.used for n in holders)
        if demand <= running:
            scale = demand / running if running > 0 else 0.0
            for node in holders:
                node.used *= scale
            return demand
        extra = demand - running
        active = sorted(
            (n for n in holders if n.state is NodeState.ACTIVE), key=lambda n: (-n.used, n.node_id)
        )
        for node in active:
            if extra <= 0:
                break
            add = min(node.gpus - node.used, extra)
            node.used += add
            extra -= add
        return demand - extra
