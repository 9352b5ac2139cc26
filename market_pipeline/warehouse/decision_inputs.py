"""What each kind of decision was decided on: the `inputs` column of `decisions`, one frozen
dataclass per kind (`DecisionKind`).

The stored text is `to_json()` of the kind's inputs, encoded as JSON; the keys and their order
are the table's contract with its readers (the service's SQL reads `inputs->>'tenant_id'` of a
drain, the drain planner `drain_after` of a budget guard), so a field's place in `to_json()` is
part of its meaning. `from_json` reads the stored text (or its decoded mapping) back.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from datetime import datetime
from decimal import Decimal
from typing import Any


def _decoded(stored: str | Mapping[str, Any] | None) -> dict[str, Any]:
    """The stored inputs as a mapping (a JSON column comes back as text or as a mapping)."""
    if stored is None:
        return {}
    return json.loads(stored) if isinstance(stored, str) else dict(stored)


def _moment(text: str | None) -> datetime | None:
    return None if text is None else datetime.fromisoformat(text)


@dataclass(frozen=True)
class PriceInputs:
    """A price decision (shadow mode): the price the tick would publish and from when."""

    price_per_gpu_hour: Decimal | float
    effective_from: datetime

    def to_json(self) -> dict[str, Any]:
        return {
            "price_per_gpu_hour": str(self.price_per_gpu_hour),
            "effective_from": self.effective_from.isoformat(),
        }

    @classmethod
    def from_json(cls, stored: str | Mapping[str, Any]) -> PriceInputs:
        data = _decoded(stored)
        return cls(Decimal(data["price_per_gpu_hour"]), datetime.fromisoformat(data["effective_from"]))


@dataclass(frozen=True)
class ScaleInputs:
    """A scaling decision: the pool's state and capacity target the policy saw this tick
    (the same for every decision of the tick), the facts of the one decision (None: not
    one of its facts), and, once the decision is recorded, its count and certificate margin."""

    forecast_q90: float
    price: float
    demand_gpus: float
    backlog_gpus: float
    target_nodes: int
    need_nodes: int
    keep_nodes: int
    keep_band_nodes: int
    demand_need_nodes: int
    demand_step_gpus: float
    wanted_gpus: float
    schedulable: int
    booting: int
    cordoned: int
    standby: int
    warming: int
    floor_nodes: int
    max_nodes: int
    target_certified: bool
    target_shield: tuple[str, ...]
    # the decision's own facts
    saving: float | None = None  # a scale-down's expected saving ...
    cost: float | None = None  # ... against its drain and replacement cost
    unneeded_minutes: float | None = None  # how long the node has been surplus
    used_gpus: float | None = None  # the GPUs its tasks use
    to: str | None = None  # a power transition's end: "standby" or "off"
    drain_failures: int | None = None  # the node's failed drains so far
    transient_price_ratio: float | None = None  # a held shortfall's price ratio
    # as recorded
    count: int | None = None
    certificate_margin: float | None = None

    _FACTS = (
        "saving",
        "cost",
        "unneeded_minutes",
        "used_gpus",
        "to",
        "drain_failures",
        "transient_price_ratio",
    )

    def with_facts(self, **facts: Any) -> ScaleInputs:
        """These inputs with one decision's facts (a name not among them is a defect)."""
        unknown = sorted(set(facts) - set(self._FACTS))
        if unknown:
            raise TypeError(f"not a scaling decision's fact: {', '.join(unknown)}")
        return replace(self, **facts)

    def recorded(self, count: int, certificate_margin: float | None) -> ScaleInputs:
        return replace(self, count=count, certificate_margin=certificate_margin)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "target_shield":
                out[f.name] = list(value)
            elif f.name in self._FACTS:
                if value is not None:
                    out[f.name] = value
            elif f.name in ("count", "certificate_margin"):
                if self.count is not None:  # recorded: both stored, the margin may be null
                    out[f.name] = value
            else:
                out[f.name] = value
        return out

    @classmethod
    def from_json(cls, stored: str | Mapping[str, Any]) -> ScaleInputs:
        data = _decoded(stored)
        values = {f.name: data.get(f.name) for f in fields(cls)}
        values["target_shield"] = tuple(values["target_shield"] or ())
        return cls(**values)

    @staticmethod
    def stored_count(stored: str | Mapping[str, Any] | None) -> int:
        """The node count a stored scaling decision acts on (1 when it names none)."""
        return int(_decoded(stored).get("count", 1))


@dataclass(frozen=True)
class DrainInputs:
    """A task drain: the task as it ran (its snapshot, the drain protocol's own encoding),
    the trigger, the task's drainability score and utilisation, and the fleet's clock."""

    task: Mapping[str, Any]
    tenant_id: str
    node_id: str
    trigger: str
    score: float
    score_components: Mapping[str, Any]
    util_mean_pct: float | None
    util_max_pct: float | None
    fleet_now: datetime

    def to_json(self) -> dict[str, Any]:
        return {
            "task": dict(self.task),
            "tenant_id": self.tenant_id,
            "node_id": self.node_id,
            "trigger": self.trigger,
            "score": self.score,
            "score_components": dict(self.score_components),
            "util_mean_pct": self.util_mean_pct,
            "util_max_pct": self.util_max_pct,
            "fleet_now": self.fleet_now.isoformat(),
        }

    @classmethod
    def from_json(cls, stored: str | Mapping[str, Any]) -> DrainInputs:
        data = _decoded(stored)
        return cls(
            data["task"],
            data["tenant_id"],
            data["node_id"],
            data["trigger"],
            data["score"],
            data["score_components"],
            data["util_mean_pct"],
            data["util_max_pct"],
            datetime.fromisoformat(data["fleet_now"]),
        )

    @staticmethod
    def stored_task(stored: str | Mapping[str, Any] | None) -> Mapping[str, Any] | None:
        """The task snapshot of a stored drain decision (None: it carries none)."""
        return _decoded(stored).get("task")


@dataclass(frozen=True)
class BudgetGuardInputs:
    """A budget guard: the tenant's balance, what it has available, the next interval's
    cost and when its running tasks may be drained (the grace period's end); a guard's
    drain of one task also names the tenant."""

    balance: Decimal
    available: Decimal | None
    next_interval_cost: Decimal
    drain_after: datetime | None
    tenant_id: str | None = None

    def for_tenant(self, tenant_id: str) -> BudgetGuardInputs:
        return replace(self, tenant_id=tenant_id)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "balance": str(self.balance),
            "available": None if self.available is None else str(self.available),
            "next_interval_cost": str(self.next_interval_cost),
            "drain_after": None if self.drain_after is None else self.drain_after.isoformat(),
        }
        if self.tenant_id is not None:
            out["tenant_id"] = self.tenant_id
        return out

    @classmethod
    def from_json(cls, stored: str | Mapping[str, Any] | None) -> BudgetGuardInputs:
        data = _decoded(stored)
        available = data.get("available")
        return cls(
            Decimal(data.get("balance", "0")),
            None if available is None else Decimal(available),
            Decimal(data.get("next_interval_cost", "0")),
            _moment(data.get("drain_after")),
            data.get("tenant_id"),
        )


DecisionInputs = PriceInputs | ScaleInputs | DrainInputs | BudgetGuardInputs
