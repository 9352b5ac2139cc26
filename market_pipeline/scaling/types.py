"""Typed inputs and outputs of the scaling policy, and the memory it keeps between ticks."""

from __future__ import annotations

import datetime as dt
import hashlib
import math
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any

from market_pipeline.tick.certificate import BacklogParams
from market_pipeline.warehouse.decision_inputs import ScaleInputs
from market_pipeline.warehouse.decisions import DecisionAction


class ScalingError(ValueError):
    """An input to the scaling policy is invalid; the message names the field."""


def _require(condition: bool, field_name: str, problem: str) -> None:
    if not condition:
        raise ScalingError(f"{field_name}: {problem}")


class NodeState(StrEnum):
    ACTIVE = "active"  # powered, schedulable
    BOOTING = "booting"  # powered on, not yet schedulable
    CORDONED = "cordoned"  # powered, no new tasks: being drained for removal
    STANDBY = "standby"  # warm pool: powered down, resumes in about a minute
    WARMING = "warming"  # booting on its way into the warm pool
    OFF = "off"  # cold: needs a full boot / provisioning


POWERED_STATES = frozenset({NodeState.ACTIVE, NodeState.BOOTING, NodeState.CORDONED, NodeState.WARMING})

# What the scaling policy decides (the rest of `DecisionAction` is other kinds').
SCALING_ACTIONS: frozenset[DecisionAction] = frozenset(
    {
        DecisionAction.SCALE_UP,
        DecisionAction.SCALE_DOWN,
        DecisionAction.CORDON,
        DecisionAction.UNCORDON,
        DecisionAction.POWER_ON,
        DecisionAction.POWER_OFF,
        DecisionAction.HOLD,
        DecisionAction.REPLACE,
    }
)
# Decisions that change how many nodes are powered (what `actions_per_day` counts).
CAPACITY_ACTIONS: frozenset[DecisionAction] = frozenset(
    {DecisionAction.SCALE_UP, DecisionAction.POWER_ON, DecisionAction.SCALE_DOWN}
)


@dataclass(frozen=True)
class NodeView:
    node_id: str
    state: NodeState
    gpus: int
    used_gpus: float = 0.0
    task_gpus: tuple[float, ...] = ()
    ready_at: dt.datetime | None = None
    healthy: bool = True

    def __post_init__(self) -> None:
        if self.node_id and self.gpus > 0 and 0 <= self.used_gpus <= self.gpus + 1e-9:
            return  # the common case, checked in one go: replays build many views
        _require(bool(self.node_id), "node_id", "must be non-empty")
        _require(self.gpus > 0, f"nodes[{self.node_id}].gpus", "must be > 0")
        raise ScalingError(f"nodes[{self.node_id}].used_gpus: must be in [0, gpus], got {self.used_gpus}")

    @property
    def free_gpus(self) -> float:
        return self.gpus - self.used_gpus


@dataclass(frozen=True)
class DrainStatus:
    """The task-drain guardrail's latest word on one node (its tasks, not the backlog)."""

    node_id: str
    all_tasks_drained_or_migrated: bool
    blocked: bool = False
    attempts: int = 0
    reason: str = ""


@dataclass(frozen=True)
class PoolState:
    pool: str
    node_gpus: int
    max_nodes: int
    demand_gpus: float  # observed running + pending GPUs
    backlog_gpus: float = 0.0  # observed pending GPUs
    min_nodes: int = 0
    gpu_hour_cost: float = 1.0  # cost of keeping one GPU powered for an hour
    # the capacity the market tick's shield certified at the equilibrium price (its capacity
    # target): the need is never below it
    certified_gpus: float = 0.0
    # the highest price the market tick may publish next interval (its promise window: the
    # step from the price in force, the guaranteed cap): what pricing can absorb a shortfall with
    price_ceiling: float = math.inf

    def __post_init__(self) -> None:
        _require(self.node_gpus > 0, "node_gpus", "must be > 0")
        _require(0 <= self.min_nodes <= self.max_nodes, "min_nodes", "must be in [0, max_nodes]")
        for name in ("demand_gpus", "backlog_gpus", "gpu_hour_cost", "certified_gpus"):
            value = getattr(self, name)
            _require(math.isfinite(value) and value >= 0, name, f"must be finite and >= 0, got {value!r}")


@dataclass(frozen=True)
class ScalingConfig:
    """Policy settings; times in minutes unless named otherwise, costs in the price unit.

    The defaults are the values measured on the Helios replays (see `scaling-eval`);
    `settings.scaling_config_from_config` overlays the project configuration.
    """

    backlog: BacklogParams = field(default_factory=BacklogParams)
    headroom_fraction: float = 0.0  # above observed demand (the need takes the forecast quantile if higher)
    headroom_min_gpus: float = 0.0
    keep_window_hours: float = 12.0  # recent peak that holds capacity against churn...
    keep_band_fraction: float = 0.15  # ...up to this share of the need above it, or one typical
    keep_band_step_changes: int = 256  # demand step (median of this many recent changes; 0: off)...
    keep_band_max_fraction: float = 0.4  # ...but no more than this share of the need
    keep_deadband_fraction: float = (
        0.25  # held above demand + headroom: a typical step, at most this share of a node
    )
    keep_headroom_fraction: float = 0.0
    drainable_floor_window_hours: float = 168.0  # peak that must stay drainable at price_max
    drainable_floor_quantile: float = 1.0  # of the hourly peaks in that window (1: the max)
    scale_up_extra_nodes: int = 0
    cover_interval_on_scale_up: bool = True  # resume enough warm nodes to certify the tick's mean
    max_transient_price_ratio: float = 1.5  # a dearer shortfall is scaled, not priced
    scale_up_persistence_minutes: float = 60.0  # a cheaper one must last this long
    urgent_persistence_minutes: float = 3.0  # a dear one this long (one tick: not a blip)
    # while observed demand leaves GPUs free in service and nothing queues, a shortfall is the
    # headroom's or the forecast's alone: it must last this long (one tick): a spike is priced
    anticipatory_persistence_minutes: float = 5.0
    min_scale_down_nodes: int = 1
    min_scale_down_fraction: float = 0.12  # smallest scale-down batch, share of the pool
    hysteresis_minutes: float = 15.0  # a node must be unneeded this long
    scale_up_cooldown_minutes: float = 5.0  # no scale-down this soon after a scale-up
    failed_scale_down_cooldown_minutes: float = 30.0  # a node whose drain failed is skipped this long...
    failed_drains_to_pause_pool: int = 3  # ...and this many such nodes at once pause the pool's scale-down
    max_drain_attempts: int = 3  # then the node is reported as blocked_drain
    drain_timeout_minutes: float = 30.0
    blocked_recheck_minutes: float = 360.0  # one more attempt per period, never a loop
    # no flapping: a node whose drain failed is cordoned at most this often a day; past it,
    # other nodes stand in (the retries of a drain the task-drain guardrail kept refusing
    # cycled one node 4x a day). A removal that completes (the node powers off), or one
    # reversed because demand came back, is the pool's scaling, paced by the hysteresis.
    max_cordons_per_day: int = 2
    drain_cost_per_gpu: float = 0.05
    replacement_cost_per_node: float = 2.0
    max_expected_off_hours: float = 4.0  # cap on the saving a removal is credited with
    disruption_budget_pct: float = 10.0  # busy nodes drained at once, share of the pool
    max_removals_per_hour: int = 6  # nodes with work drained per hour
    scale_down_wave_minutes: float = 30.0  # drained nodes wait this long for the next wave (0: off)
    warm_pool_nodes: int = 1  # the warm pool's minimum size
    warm_to_recent_peak: bool = True  # keep warm what a return to a recent peak needs...
    warm_reserve_window_hours: float = 168.0  # ...the peak of this window (scaling-tune: 12 or 168)
    # in service + standby >= this share of max_nodes: what no recent peak predicts (a job
    # larger than any seen in the window) still resumes warm nodes
    warm_reserve_fleet_fraction: float = 0.0
    interval_minutes: float = 3.0  # the control tick the certificate covers
    warm_resume_minutes: float = 1.0  # a standby node serves the rest of the interval

    def __post_init__(self) -> None:
        for name in (
            "headroom_fraction",
            "headroom_min_gpus",
            "hysteresis_minutes",
            "keep_window_hours",
            "keep_band_fraction",
            "keep_band_max_fraction",
            "keep_headroom_fraction",
            "drainable_floor_window_hours",
            "scale_up_persistence_minutes",
            "min_scale_down_fraction",
            "urgent_persistence_minutes",
            "scale_up_cooldown_minutes",
            "failed_scale_down_cooldown_minutes",
            "drain_cost_per_gpu",
            "replacement_cost_per_node",
            "warm_resume_minutes",
            "scale_down_wave_minutes",
            "warm_reserve_window_hours",
            "keep_deadband_fraction",
            "anticipatory_persistence_minutes",
        ):
            value = getattr(self, name)
            _require(math.isfinite(value) and value >= 0, name, f"must be finite and >= 0, got {value!r}")
        _require(self.max_drain_attempts >= 1, "max_drain_attempts", "must be >= 1")
        _require(self.max_cordons_per_day >= 1, "max_cordons_per_day", "must be >= 1")
        _require(self.failed_drains_to_pause_pool >= 1, "failed_drains_to_pause_pool", "must be >= 1")
        _require(self.interval_minutes > 0, "interval_minutes", "must be > 0")
        _require(self.drain_timeout_minutes > 0, "drain_timeout_minutes", "must be > 0")
        _require(self.blocked_recheck_minutes > 0, "blocked_recheck_minutes", "must be > 0")
        _require(self.max_expected_off_hours > 0, "max_expected_off_hours", "must be > 0")
        _require(0 <= self.disruption_budget_pct <= 100, "disruption_budget_pct", "must be in [0, 100]")
        _require(self.max_removals_per_hour >= 0, "max_removals_per_hour", "must be >= 0")
        _require(self.warm_pool_nodes >= 0, "warm_pool_nodes", "must be >= 0")
        _require(
            math.isfinite(self.warm_reserve_fleet_fraction) and 0 <= self.warm_reserve_fleet_fraction <= 1,
            "warm_reserve_fleet_fraction",
            "must be in [0, 1]",
        )
        _require(0 <= self.drainable_floor_quantile <= 1, "drainable_floor_quantile", "must be in [0, 1]")
        _require(self.max_transient_price_ratio >= 1, "max_transient_price_ratio", "must be >= 1")
        _require(self.keep_band_step_changes >= 0, "keep_band_step_changes", "must be >= 0")
        _require(self.scale_up_extra_nodes >= 0, "scale_up_extra_nodes", "must be >= 0")
        _require(self.min_scale_down_nodes >= 1, "min_scale_down_nodes", "must be >= 1")


class ScalingReason(StrEnum):
    """Why a scaling decision was held, blocked or taken: the typed code of a reason; the
    stored reason text starts with the value (what operators and older rows read)."""

    TRANSIENT = "transient"  # a shortfall the price absorbs while it lasts
    ANTICIPATORY = "anticipatory"  # a shortfall only the headroom or the forecast asks for
    BATCH_IN_PROGRESS = "batch_in_progress"
    SCALE_UP_COOLDOWN = "scale_up_cooldown"
    FAILED_SCALE_DOWN_COOLDOWN = "failed_scale_down_cooldown"
    HYSTERESIS = "hysteresis"
    FLAP_GUARD = "flap_guard"
    DISRUPTION_BUDGET = "disruption_budget"
    NO_SAVING = "no_saving"
    NO_ROOM = "no_room"
    DRAIN_IN_PROGRESS = "drain_in_progress"
    BLOCKED_DRAIN = "blocked_drain"
    UNHEALTHY = "unhealthy"
    PREWARM = "prewarm"


@dataclass(frozen=True)
class Why:
    """A typed reason: renders as `code (aside): detail`, the text stored with the decision."""

    code: ScalingReason
    detail: str = ""
    aside: str = ""

    def __str__(self) -> str:
        head = f"{self.code.value} ({self.aside})" if self.aside else self.code.value
        return f"{head}: {self.detail}" if self.detail else head


@dataclass
class ScalingDecision:
    decision_id: str
    pool: str
    action: DecisionAction
    node_id: str | None
    allowed: bool
    reasons: list[str]
    inputs: ScaleInputs
    certificate_margin: float | None
    decided_at: str
    count: int = 1
    codes: tuple[ScalingReason, ...] = ()  # the typed codes among `reasons`, in order

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "inputs": self.inputs.to_json()}


def decision_id(pool: str, now: dt.datetime, action: str, node_id: str | None, seq: int) -> str:
    """Stable across reruns of the same tick: pool, time, action, node and position."""
    key = f"{pool}|{now.isoformat()}|{action}|{node_id or '-'}|{seq}"
    return hashlib.sha1(key.encode()).hexdigest()[:16]


def as_utc(now: dt.datetime) -> dt.datetime:
    """Naive datetimes are read as UTC so the memory's epoch seconds never depend on the host."""
    return now.replace(tzinfo=dt.UTC) if now.tzinfo is None else now


@dataclass
class ScalerMemory:
    """What the policy must remember between ticks; the caller persists `to_dict()`.

    Times are epoch seconds. `surplus_since[k]` is when the pool last started having at
    least k unneeded nodes without interruption (per-rank hysteresis). `demand_peaks` maps
    an hour (epoch seconds // 3600) to the highest demand observed in it: the envelope
    below which the policy does not scale down. `busy_drains` holds when drains of nodes
    with work started (the last day), for the hourly disruption budget. `demand_steps` holds
    the last non-zero changes of demand between ticks (`last_demand` is the previous tick's):
    their median is the pool's typical demand step, the least keep band; `demand_rises` the
    last rises, whose largest the warm reserve holds above the recent peak. `drain_failed_at`
    holds when each node's last drain failed: its own cool-down, and, when enough nodes
    fail within it, the pool's. `cordons` and `uncordons` hold when the policy cordoned each
    node and when it reversed a cordon (the last day and a drain's length): the no-flapping limit.
    """

    pool: str
    last_scale_up_at: float | None = None
    need_since: float | None = None
    surplus_since: dict[int, float] = field(default_factory=dict)
    draining: dict[str, float] = field(default_factory=dict)
    drain_failures: dict[str, int] = field(default_factory=dict)
    drain_failed_at: dict[str, float] = field(default_factory=dict)  # node -> its last failed drain
    blocked: dict[str, float] = field(default_factory=dict)
    cordons: dict[str, list[float]] = field(default_factory=dict)  # node -> when the policy cordoned it
    uncordons: dict[str, list[float]] = field(default_factory=dict)  # node -> when it reversed a cordon
    busy_drains: list[float] = field(default_factory=list)
    demand_peaks: dict[int, float] = field(default_factory=dict)
    last_demand: float | None = None
    demand_steps: list[float] = field(default_factory=list)  # recent non-zero demand changes, oldest first
    demand_rises: list[float] = field(default_factory=list)  # recent rises between ticks, oldest first

    def note_cordon(self, node_id: str, t: float) -> None:
        self.cordons.setdefault(node_id, []).append(t)

    def note_uncordon(self, node_id: str, t: float) -> None:
        self.uncordons.setdefault(node_id, []).append(t)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["surplus_since"] = {str(k): v for k, v in self.surplus_since.items()}
        data["demand_peaks"] = {str(k): v for k, v in self.demand_peaks.items()}
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ScalerMemory:
        try:
            return cls(
                pool=str(data["pool"]),
                last_scale_up_at=_opt_float(data.get("last_scale_up_at")),
                need_since=_opt_float(data.get("need_since")),
                surplus_since={int(k): float(v) for k, v in data.get("surplus_since", {}).items()},
                draining={str(k): float(v) for k, v in data.get("draining", {}).items()},
                drain_failures={str(k): int(v) for k, v in data.get("drain_failures", {}).items()},
                drain_failed_at={str(k): float(v) for k, v in data.get("drain_failed_at", {}).items()},
                blocked={str(k): float(v) for k, v in data.get("blocked", {}).items()},
                cordons={str(k): [float(t) for t in v] for k, v in data.get("cordons", {}).items()},
                uncordons={str(k): [float(t) for t in v] for k, v in data.get("uncordons", {}).items()},
                busy_drains=[float(v) for v in data.get("busy_drains", [])],
                demand_peaks={int(k): float(v) for k, v in data.get("demand_peaks", {}).items()},
                last_demand=_opt_float(data.get("last_demand")),
                demand_steps=[float(v) for v in data.get("demand_steps", [])],
                demand_rises=[float(v) for v in data.get("demand_rises", [])],
            )
        except KeyError as exc:
            raise ScalingError(f"scaler memory: missing key {exc.args[0]!r}") from None
        except (TypeError, ValueError) as exc:
            raise ScalingError(f"scaler memory: malformed value ({exc})") from None


def _opt_float(value: Any) -> float | None:
    return None if value is None else float(value)
