"""One planning call's state (`Tick`): what `policy.plan_pool` knows about a pool this tick,
and the decisions made so far. The gates (`drain_gates`, `warm_pool`) and the disruption
methods (`disruption`) read and extend it; policy, gates and methods all import it from here,
none from each other's callers (no import circle)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from market_pipeline.scaling.capacity import CapacityTarget, FleetView, backlog_state
from market_pipeline.scaling.types import (
    DrainStatus,
    NodeView,
    PoolState,
    ScalerMemory,
    ScalingConfig,
    ScalingDecision,
    Why,
    decision_id,
)
from market_pipeline.tick.certificate import certify
from market_pipeline.warehouse.decision_inputs import ScaleInputs
from market_pipeline.warehouse.decisions import DecisionAction


@dataclass
class Tick:
    """Everything one planning call knows, plus the decisions it has made so far."""

    pool_state: PoolState
    forecast_q90: float
    price: float
    config: ScalingConfig
    now: dt.datetime
    t: float
    memory: ScalerMemory
    fleet: FleetView
    target: CapacityTarget
    drain_status: Mapping[str, DrainStatus]
    base_inputs: ScaleInputs
    decisions: list[ScalingDecision] = field(default_factory=list)
    uncordoned: int = 0
    drained: list[NodeView] = field(default_factory=list)  # cordoned, empty, batch complete
    surplus: int = 0  # nodes in service above the target, when the tick does not scale up

    @property
    def in_service(self) -> int:
        return self.fleet.in_service + self.uncordoned

    def certified_at(self, nodes: int) -> tuple[bool, float]:
        """Whether the equilibrium price is certified with `nodes` in service, and the margin."""
        gpus = float(nodes * self.pool_state.node_gpus)
        state = backlog_state(self.pool_state, self.forecast_q90, self.price, gpus)
        cert = certify(state, self.price, gpus, self.config.backlog)
        return cert.admissible, cert.margin

    def add(
        self,
        action: DecisionAction,
        node_id: str | None,
        allowed: bool,
        reasons: list[str | Why],
        margin: float | None = None,
        count: int = 1,
        **extra: Any,
    ) -> ScalingDecision:
        seq = len(self.decisions)
        decision = ScalingDecision(
            decision_id=decision_id(self.pool_state.pool, self.now, action, node_id, seq),
            pool=self.pool_state.pool,
            action=action,
            node_id=node_id,
            allowed=allowed,
            reasons=[str(r) for r in reasons],
            inputs=self.base_inputs.with_facts(**extra),
            certificate_margin=margin if margin is not None else self.target.shielded.certificate.margin,
            decided_at=self.now.isoformat(),
            count=count,
            codes=tuple(r.code for r in reasons if isinstance(r, Why)),
        )
        self.decisions.append(decision)
        return decision
