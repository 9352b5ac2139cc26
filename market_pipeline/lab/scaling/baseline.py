"""A cluster-autoscaler-style baseline, for replays against the policy.

Defaults of kubernetes/autoscaler's cluster-autoscaler: scale up when pods are pending
(enough new nodes for them, counting nodes already booting); remove a node once
utilisation has been under 50% for 10 minutes (scale-down-unneeded-time) and 10 minutes
after the last scale-up (scale-down-delay-after-add); non-empty nodes one at a time; a node
whose drain fails is skipped for 5 minutes and then tried again (no cap on retries).

`utilisation="pool"` reads utilisation across the pool, which is what every node shows
under the default kube-scheduler (LeastAllocated spreads load evenly); `"node"` reads each
node's own utilisation under the replay's bin packing, a more aggressive variant.
No warm pool: new nodes boot cold. The price stays at the reference price.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

from market_pipeline.lab.scaling.fleet_sim import Fleet
from market_pipeline.scaling.types import NodeState


@dataclass(frozen=True)
class AutoscalerParams:
    utilisation_threshold: float = 0.5
    unneeded_minutes: int = 10
    delay_after_scale_up_minutes: int = 10
    unremovable_backoff_minutes: int = 5
    utilisation: Literal["pool", "node"] = "pool"


@dataclass
class StepOutcome:
    scale_up_events: int = 0
    removals: int = 0


@dataclass
class ClusterAutoscalerBaseline:
    params: AutoscalerParams = field(default_factory=AutoscalerParams)
    low_since: int | None = None
    node_low_since: dict[str, int] = field(default_factory=dict)
    last_scale_up: int | None = None
    draining: str | None = None
    backoff_until: dict[str, int] = field(default_factory=dict)

    def step(self, fleet: Fleet, minute: int, served_prev: float, pending_prev: float) -> StepOutcome:
        outcome = StepOutcome()
        self._finish_drain(fleet, minute, outcome)
        upcoming = fleet.booting_gpus()
        if pending_prev > upcoming + 1e-9:
            wanted = math.ceil((pending_prev - upcoming) / fleet.params.node_gpus)
            if fleet.power_on_cold(wanted, minute) > 0:
                outcome.scale_up_events += 1
                self.last_scale_up = minute
        candidate = self._unneeded_candidate(fleet, minute, served_prev)
        if candidate is not None and self._may_remove(minute, pending_prev):
            fleet.cordon(candidate, minute)
            self.draining = candidate
            self._finish_drain(fleet, minute, outcome)
        return outcome

    def _may_remove(self, minute: int, pending_prev: float) -> bool:
        if self.draining is not None or pending_prev > 0:
            return False
        return (
            self.last_scale_up is None
            or minute - self.last_scale_up >= self.params.delay_after_scale_up_minutes
        )

    def _unneeded_candidate(self, fleet: Fleet, minute: int, served_prev: float) -> str | None:
        active = [n for n in fleet.nodes if n.state is NodeState.ACTIVE]
        if len(active) <= 1:
            return None
        eligible = [n for n in active if self.backoff_until.get(n.node_id, -1) <= minute]
        threshold = self.params.utilisation_threshold
        if self.params.utilisation == "pool":
            utilisation = served_prev / max(1, fleet.schedulable_gpus())
            if utilisation >= threshold:
                self.low_since = None
                return None
            self.low_since = minute if self.low_since is None else self.low_since
            if minute - self.low_since < self.params.unneeded_minutes or not eligible:
                return None
            return min(eligible, key=lambda n: (n.used, n.node_id)).node_id
        for node in active:
            if node.used / node.gpus < threshold:
                self.node_low_since.setdefault(node.node_id, minute)
            else:
                self.node_low_since.pop(node.node_id, None)
        ripe = [
            n
            for n in eligible
            if minute - self.node_low_since.get(n.node_id, minute) >= self.params.unneeded_minutes
        ]
        return min(ripe, key=lambda n: (n.used, n.node_id)).node_id if ripe else None

    def _finish_drain(self, fleet: Fleet, minute: int, outcome: StepOutcome) -> None:
        if self.draining is None:
            return
        status = fleet.drain_status(minute).get(self.draining)
        if status is None:
            self.draining = None
            return
        if status.all_tasks_drained_or_migrated:
            fleet.power_off(self.draining, to_standby=False)
            self.node_low_since.pop(self.draining, None)
            outcome.removals += 1
            self.draining = None
        elif status.blocked:
            fleet.uncordon(self.draining)
            self.backoff_until[self.draining] = minute + self.params.unremovable_backoff_minutes
            self.draining = None
