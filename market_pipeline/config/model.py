"""The configuration's types: the sections of `market.toml` as strict pydantic models.

Kept apart from the loader (`market_pipeline.config`) so that the fleet package, which the
loader calls to resolve pools and tenants from the fleet, can import these types without an
import cycle."""

from __future__ import annotations

import os
from datetime import datetime
from functools import cached_property
from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator

# the catalog's models are part of this module's interface (`from market_pipeline.config import Pool`)
from market_pipeline.config.catalog import Claim as Claim
from market_pipeline.config.catalog import GpuModel, Pool, Tenant, Zone, _Strict

HOME_ENV = "MARKET_PIPELINE_HOME"


class ConfigError(ValueError):
    """The configuration is invalid; the message names the key and the problem."""


class WarehouseConfig(_Strict):
    """Where the warehouse lives. `duckdb` (the embedded default): one DuckDB file at `path`.
    `ducklake` (the cluster profile): a DuckLake whose catalog is the PostgreSQL database
    `catalog_url` and whose data are Parquet files under `data_path` (a directory, or an
    S3-compatible URL), so that several machines read and write one warehouse."""

    backend: Literal["duckdb", "ducklake"] = "duckdb"
    path: str = "var/warehouse.duckdb"
    # PostgreSQL of the DuckLake catalog: a libpq string ("host=... dbname=...") or a
    # postgresql:// URL. Credentials belong in the environment (MP__WAREHOUSE__CATALOG_URL).
    catalog_url: str = ""
    data_path: str = "var/lake/"

    @model_validator(mode="after")
    def _lake_has_catalog(self) -> "WarehouseConfig":
        if self.backend == "ducklake" and not self.catalog_url:
            raise ValueError("catalog_url: backend 'ducklake' needs its PostgreSQL catalog")
        return self


class ControlConfig(_Strict):
    """Where the loop's control state lives: the state that needs one writer at a time
    (decision claims and outcomes, the drain journal) and, with `[adapter] state_store =
    "control"`, the simulated adapter's twin. `warehouse` (the embedded default): in the
    warehouse's own tables and files. `postgres` (the cluster profile): in the PostgreSQL
    database `url` (empty: the warehouse's DuckLake catalog), schema `schema_name`, with primary
    keys, atomic claims and advisory locks, so that two workers cannot both act on one decision.
    Credentials belong in the environment (MP__CONTROL__URL)."""

    backend: Literal["warehouse", "postgres"] = "warehouse"
    url: str = ""
    schema_name: str = Field("market_control", pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")


class OrchestrationConfig(_Strict):
    """Where Dagster runs a job's steps. `in_process` (the embedded default): in the run's own
    process. `celery` (the cluster profile): on Celery workers (dagster-celery) fed through
    `celery_broker` (RabbitMQ `pyamqp://...` or Redis `redis://...`), results back through
    `celery_backend`. Credentials belong in the environment (MP__ORCHESTRATION__CELERY_BROKER)."""

    executor: Literal["in_process", "celery"] = "in_process"
    celery_broker: str = "pyamqp://guest@127.0.0.1:5672//"
    celery_backend: str = "rpc://"
    # the queue the steps go to (workers started with `-q <queue>` when it is not `dagster`)
    celery_queue: str = Field("dagster", pattern=r"^[A-Za-z0-9_.-]+$")

    def celery_executor_config(self) -> dict[str, object]:
        """The dagster-celery executor's config: a run's `execution: config:` block, and what a
        worker's YAML carries under it. A worker acknowledges a step's message when the step
        ends, not when it takes it (`task_acks_late`), and gives it back if its process dies
        (`task_reject_on_worker_lost`): a worker killed mid-step leaves the step with the
        broker, which hands it to another worker, and the run resumes there."""
        return {
            "broker": self.celery_broker,
            "backend": self.celery_backend,
            "config_source": {
                "task_acks_late": True,
                "task_reject_on_worker_lost": True,
                "task_default_queue": self.celery_queue,
            },
        }


class AdapterConfig(_Strict):
    backend: Literal["simulated", "local-process", "nvml", "dcgm", "slurm"] = "simulated"
    state_path: str = "var/fleet_state.json"
    # where the simulated twin lives: `file` (state_path and the folder beside it, one machine)
    # or `control` (the control PostgreSQL, read and written by any worker under a lock)
    state_store: Literal["file", "control"] = "file"
    seed: int = 7
    fleet_source: str = "config"
    workload_source: str = "builtin"
    dcgm_endpoint: str = ""
    operation_timeout_seconds: float = Field(10.0, gt=0)
    # the zone of the host a real backend (nvml, dcgm) runs on: its pools are "<model>@<zone>"
    zone: str = "local"
    # slurm: the cluster's slurm.conf (default: the local test cluster `cluster up` starts;
    # /etc/slurm/slurm.conf for a real one) and the partition or QOS of drainable jobs
    slurm_conf: str = "var/slurm/etc/slurm.conf"
    slurm_drainable: str = "drainable"
    # The simulated fleet: arrival profile ("diurnal" or a Helios per-minute CSV), placement
    # policy, and the UTC start of its clock (default: midnight a week ago, at first creation).
    arrival_source: str = "diurnal"
    placement_policy: Literal["round_robin", "best_fit", "fragment_aware"] = "best_fit"
    sim_epoch: datetime | None = None
    # Tenants of a node-list fleet: "config", "workload" (QoS class x size of its job shapes)
    # or "auto" (the configured ones when they claim every GPU model of the fleet).
    tenants_source: Literal["auto", "config", "workload"] = "auto"

    @model_validator(mode="after")
    def _epoch_is_utc(self) -> "AdapterConfig":
        if self.sim_epoch is not None and self.sim_epoch.tzinfo is None:
            raise ValueError("sim_epoch must carry a UTC offset, e.g. 2026-11-01T00:00:00Z")
        return self


class LoopConfig(_Strict):
    tick_minutes: int = Field(5, ge=1, le=60)
    sample_interval_seconds: int = Field(60, ge=1, le=3600)
    shadow_mode: bool = False
    demo_days: float = Field(1.0, gt=0, le=31)

    @model_validator(mode="after")
    def _tick_divides_the_hour(self) -> "LoopConfig":
        # the control_loop_tick schedule is a cron "*/N * * * *": an N that does not divide
        # 60 would fire unevenly (e.g. */7 at :56 and again at :00), not every N minutes
        if 60 % self.tick_minutes:
            raise ValueError(
                f"tick_minutes={self.tick_minutes} must divide 60 (1, 2, 3, 4, 5, 6, 10, 12, 15, 20, "
                "30 or 60) so the control_loop_tick cron fires every tick_minutes"
            )
        return self

    @property
    def tick_cron(self) -> str:
        """The `control_loop_tick` schedule: every `tick_minutes`, aligned to the hour."""
        return "0 * * * *" if self.tick_minutes == 60 else f"*/{self.tick_minutes} * * * *"


class MarketConfig(_Strict):
    drainable_discount_min: float = Field(0.2, ge=0, lt=1)
    drainable_discount_max: float = Field(0.6, ge=0, lt=1)
    max_price_step: float = Field(0.25, gt=0, le=10)
    # The promise to rigid tenants: the guaranteed price never exceeds this multiple of the
    # pool's list (base) price, on any published price, live or simulated (the premium a rigid
    # tenant pays for the assurance is meant to stay near 5%; 4% keeps a point for the pool mix).
    guaranteed_price_cap: float = Field(1.04, ge=1.0, le=10)
    # Tenants are sized so that at the list price a pool's typical load buys with this price
    # elasticity: 2 makes the list price the equilibrium of a typical hour when a GPU-hour
    # costs half its list price (Lerner: (p - c) / p = 1 / e), as in the shipped catalog.
    reference_elasticity: float = Field(2.0, gt=1.0, le=20)
    # The warm solve keeps the local optimum it starts in; on this schedule a tick also solves
    # cold with the global phase and walks (within the step) to an optimum this much better.
    global_resolve_minutes: int = Field(60, ge=0, le=1440)  # 0: never
    global_switch_threshold: float = Field(0.001, ge=0, le=1)
    response_smoothing_beta: float = Field(0.5, gt=0, le=1)
    solver_max_iterations: int = Field(500, ge=1)
    solver_tolerance: float = Field(1e-6, gt=0)

    @model_validator(mode="after")
    def _band_ordered(self) -> "MarketConfig":
        if self.drainable_discount_min > self.drainable_discount_max:
            raise ValueError("drainable_discount_min must not exceed drainable_discount_max")
        return self


class BacklogGuardrailConfig(_Strict):
    residual_floor_share: float = Field(0.15, ge=0, le=1)
    drift_margin: float = Field(0.05, ge=0, lt=1)
    drift_margin_min_gpus: float = Field(0.5, ge=0)
    price_elasticity: float = Field(0.8, ge=0)


class DisruptionBudgetConfig(_Strict):
    """A scheduled or per-reason disruption budget (Karpenter style): `nodes` is a count or 'N%'."""

    nodes: str
    reasons: list[str] = Field(default_factory=list)
    schedule: str | None = None
    duration_minutes: float | None = None

    @model_validator(mode="after")
    def _parses(self) -> "DisruptionBudgetConfig":
        from market_pipeline.disruption.budget import BudgetRule

        BudgetRule.parse(self.model_dump(exclude_none=True))
        return self


class TaskDrainGuardrailConfig(_Strict):
    warn_seconds: float = Field(30.0, ge=0)
    checkpoint_timeout_seconds: float = Field(60.0, ge=0)
    terminate_timeout_seconds: float = Field(30.0, ge=0)
    max_total_seconds: float = Field(600.0, gt=0)
    # Release verification after the task is gone: checked until its GPUs are free or this
    # deadline passes, pausing from the initial backoff, doubling up to the max, between checks.
    release_timeout_seconds: float = Field(20.0, ge=0, le=3600)
    release_backoff_initial_seconds: float = Field(0.1, gt=0, le=60)
    release_backoff_max_seconds: float = Field(2.0, gt=0, le=600)
    tenant_max_drains_per_day: int = Field(4, ge=0)
    pool_disruption_budget_pct: float = Field(10.0, ge=0, le=100)
    landing_cooldown_minutes: float = Field(15.0, ge=0)
    under_use_util_pct: float = Field(20.0, ge=0, le=100)
    under_use_minutes: float = Field(5.0, ge=0)
    pressure_util_pct: float = Field(92.0, ge=0, le=100)
    budgets: list[DisruptionBudgetConfig] = Field(default_factory=list)

    @model_validator(mode="after")
    def _backoff_grows(self) -> "TaskDrainGuardrailConfig":
        if self.release_backoff_max_seconds < self.release_backoff_initial_seconds:
            raise ValueError(
                "release_backoff_max_seconds must be >= release_backoff_initial_seconds, got "
                f"{self.release_backoff_max_seconds} < {self.release_backoff_initial_seconds}"
            )
        return self


class RigidGuaranteeConfig(_Strict):
    """The promise to rigid (guaranteed-class) tenants and the rule that keeps it
    (`placement.guarantee`): the oldest waiting guaranteed jobs of a pool each hold the node
    nearest to fitting them, up to `hold_max_nodes_share` of the pool's nodes; drainable work
    is not placed there, and new guaranteed work only where it fits nowhere else; with
    `close_to_drainable`, drainable work is not placed on any node of the waiting work's GPU
    model; with `forecast_window_minutes`, the room forecast guaranteed arrivals need is kept
    from drainable work before any waits, and with `empty_nodes_kept`, empty nodes for
    whole-node guaranteed work (refilled as whole-node jobs take them, `refill_empty_nodes`).
    The promise: against static pricing on the same week, market pricing leaves no more rigid
    jobs past their SLA wait (`max_violations_vs_static`) and no more rigid jobs waiting
    (`max_waiting_vs_static`), judged on every simulated tick."""

    enabled: bool = True
    hold_max_nodes_share: float = Field(1.0, ge=0, le=1)
    # while guaranteed work waits, new drainable work keeps off every node of its GPU model
    # (the simulator's pool; `placement.guarantee.closed_nodes`), not only off the held ones
    close_to_drainable: bool = True
    # before any guaranteed work waits, the room for the guaranteed arrivals forecast within one
    # SLA wait (`guardrails.task_drain.max_total_seconds`) is kept from new drainable work, the
    # forecast being the arrivals per request shape over this trailing window
    # (`placement.guarantee.reserved_nodes`); 0 turns the reserve off. Four hours since round
    # eighteen of #46 (one before): after a lull, the last hour expects nothing of the next wave
    forecast_window_minutes: float = Field(240.0, ge=0)
    # and the last this many empty largest nodes of a GPU model are kept from new drainable
    # work for whole-node guaranteed arrivals, at most one per 10 of its largest nodes
    # (`placement.guarantee.kept_empty`); 0 turns it off
    empty_nodes_kept: int = Field(2, ge=0)
    # while fewer of a model's largest nodes are empty than that keep, as many of its largest
    # nodes with no guaranteed work, nearest to empty, take no new drainable work either, so
    # churn refills the stock whole-node bursts take (`placement.guarantee.refilling_nodes`;
    # chosen on the tuning weeks of #46, round seventeen:
    # docs/history/rigid_guarantee_round_seventeen.md)
    refill_empty_nodes: bool = True
    # drains for a waiting rigid job are planned at the latest control step from which they still
    # end within its SLA wait (`guardrails.task_drain.max_total_seconds`), not at the first, unless
    # it needs a whole node (`placement.guarantee.drain_due`); false: at the first step
    drain_at_latest_step: bool = True
    # which due waiting guaranteed jobs a control step drains for, and in what order
    # (`placement.guarantee.drain_order`): `oldest_first`, all, oldest first (round fourteen);
    # `after_in_time`, those drains can still start within their SLA wait first, then the late
    # ones; `never`, only those still in time (chosen on the tuning weeks of #46, round fifteen:
    # docs/history/rigid_guarantee_round_fifteen.md)
    late_drains: Literal["oldest_first", "after_in_time", "never"] = "never"
    # a pool's guaranteed price carries only the share of the cap's premium its guarantee can
    # back (`tick.promises.guarantee_reach`: drainable GPUs running over guaranteed GPUs
    # waiting, 1 while none wait): a pool overloaded by guaranteed work alone asks list. Off by
    # default: on the tuning weeks of #46 the premium's thinning of such pools' arrivals served
    # rigid work better than list did (docs/history/rigid_guarantee_round_thirteen.md)
    premium_follows_reach: bool = False
    # The drainable class is sold what the guaranteed class's claim leaves of each pool: what
    # guaranteed work holds and waits for now, and with this on, what the tenants are expected
    # to hold at the prices in force where that is more (`tick.pricing.drainable_capacity`;
    # the live tick and the simulator's leader). Off by default: the tuning weeks of #46 chose
    # it (one more passed), the judged weeks rejected it (the learning leader lost revenue on
    # most of them, three more failed): docs/history/rigid_guarantee_round_fourteen.md
    drainable_leaves_expected_claim: bool = False
    max_violations_vs_static: float = Field(1.0, ge=0)
    max_waiting_vs_static: float = Field(1.0, ge=0)


class GuardrailsConfig(_Strict):
    backlog: BacklogGuardrailConfig = BacklogGuardrailConfig()
    task_drain: TaskDrainGuardrailConfig = TaskDrainGuardrailConfig()
    rigid_guarantee: RigidGuaranteeConfig = RigidGuaranteeConfig()


class ScalingConfigSection(_Strict):
    headroom: float = Field(0.10, ge=0, le=2)
    hysteresis_minutes: float = Field(15.0, ge=0)
    scale_up_cooldown_minutes: float = Field(10.0, ge=0)
    failed_scale_down_cooldown_minutes: float = Field(30.0, ge=0)
    failed_drains_to_pause_pool: int = Field(3, ge=1)
    max_drain_attempts: int = Field(3, ge=1)
    drain_cost_per_gpu: float = Field(0.05, ge=0)
    replacement_cost_per_node: float = Field(2.0, ge=0)
    # a shortfall that a price within max_transient_price_ratio absorbs is priced, not
    # scaled, until it has lasted this long (pricing for transients, scaling for trends)
    scale_up_persistence_minutes: float = Field(60.0, ge=0)
    # in service plus standby never below this share of the pool's nodes: a job larger than
    # any the pool has seen lately resumes standby nodes (a minute), not cold ones
    warm_reserve_fleet_fraction: float = Field(1.0, ge=0, le=1)


class TelemetryConfig(_Strict):
    quarantine_block_rate: float = Field(0.05, ge=0, le=1)
    quarantine_warn_rate: float = Field(0.005, ge=0, le=1)
    clock_skew_seconds: float = Field(120.0, ge=0)
    freshness_minutes: float = Field(30.0, gt=0)
    temp_min_c: float = 0.0
    temp_max_c: float = 110.0
    naive_timezone: str | None = None  # IANA zone of zone-less timestamps; None: quarantine them


class CommitmentTier(_Strict):
    min_gpu_hours: float = Field(ge=0)
    discount: float = Field(ge=0, lt=1)


class DemandResponseConfig(_Strict):
    """How the loop learns the tenants' price response (`market_pipeline.demand_response`)."""

    enabled: bool = True  # the tick calibrates the tenants to the latest fit
    refit_hours: Literal[1, 2, 3, 4, 6, 8, 12, 24] = 1  # the refit schedule: cron "0 */refit_hours * * *"
    history_days: float = Field(14.0, gt=0, le=90)
    interval_level: float = Field(0.8, gt=0, lt=1)
    prior_sd: float = Field(1.0, gt=0, le=20)  # around market.reference_elasticity (the claims)
    experiments: bool = True  # bounded price experiments (recorded only in loop.shadow_mode)
    amplitude: float = Field(0.05, gt=0, le=0.25)
    stop_relative_width: float = Field(0.3, gt=0, le=10)
    stop_absolute_width: float = Field(0.2, gt=0, le=10)
    # the window over which deferred elastic work comes back: the fit is a distributed lag and
    # reads the long-run elasticity (0: the price now only)
    lag_hours: float = Field(3.0, ge=0, le=48)
    # the share of histories without a lag or a daily cycle where the fit keeps one anyway: each
    # asked term is tested (robust Wald, F reference) at this over the number tested; 1 keeps
    # them always. Chosen on tuning seeds of `bench demand-structure` (docs/history/demand_response_tuning.md)
    structure_alpha: float = Field(0.10, gt=0, le=1)
    # the elasticity follows a daily cycle (one harmonic of the hour of day), shrunk to none
    daily_cycle: bool = True
    # the fitted representative's budget (e > 1) is at least the spend the data show at the low
    # end of the observed prices (`tick.response.observed_budget`), at the elasticity's interval
    # lower bound ("lower_bound") or its estimate ("central"); "off": the claims' budget alone.
    # Off: both lifts broke the rigid promise on a judged week (docs/guarantee.md, round six)
    observed_budget: Literal["off", "lower_bound", "central"] = "off"


class BillingConfig(_Strict):
    grace_seconds: int = Field(10, ge=0, le=3600)
    currency: str = "USD"
    time_coefficients: dict[Literal["peak", "offpeak", "weekend"], float] = {
        "peak": 1.15,
        "offpeak": 0.90,
        "weekend": 0.85,
    }
    peak_hours: list[int] = Field(default_factory=lambda: list(range(9, 21)))
    commitment_tiers: list[CommitmentTier] = Field(
        default_factory=lambda: [CommitmentTier(min_gpu_hours=0.0, discount=0.0)]
    )
    sla_credit_rate: float = Field(0.10, ge=0, le=1)
    # idle capacity cost (agg_pool_economics): shared by tenants in proportion to their use,
    # or booked to a separate `__idle__` line (OpenCost's two modes)
    idle_cost_allocation: Literal["proportional", "idle_line"] = "proportional"

    @model_validator(mode="after")
    def _hours_valid(self) -> "BillingConfig":
        bad = [h for h in self.peak_hours if not 0 <= h <= 23]
        if bad:
            raise ValueError(f"peak_hours must be in 0..23, got {bad}")
        if any(v <= 0 for v in self.time_coefficients.values()):
            raise ValueError("time_coefficients must be positive")
        return self


class ServiceConfig(_Strict):
    """The HTTP service (`market-pipeline serve`): tenant API, console, /metrics, webhooks."""

    host: str = "127.0.0.1"
    port: int = Field(8080, ge=0, le=65535)
    # the service's own small store (API key hashes, webhooks, deliveries): SQLite, so the
    # service never writes the warehouse for its own state
    store_path: str = "var/service.sqlite"
    # per API key: a token bucket of `rate_limit_burst` refilled at `rate_limit_per_second`
    rate_limit_per_second: float = Field(20.0, gt=0)
    rate_limit_burst: int = Field(40, ge=1)
    # browsers of these origins may call the API; none by default (CORS closed)
    cors_origins: list[str] = Field(default_factory=list)
    # how long a request waits for the warehouse file while the loop's writer holds it
    read_retry_seconds: float = Field(5.0, gt=0, le=60)
    # drain-warning webhooks: outbox poll, per-call timeout, attempts and backoff
    webhook_poll_seconds: float = Field(0.2, gt=0, le=60)
    # the warehouse's own outbox, read for what the notice file beside it missed (a drain's
    # process died between the two writes): it waits for the writer, so less often
    webhook_reconcile_seconds: float = Field(5.0, gt=0, le=3600)
    webhook_timeout_seconds: float = Field(2.0, gt=0, le=60)
    webhook_max_attempts: int = Field(10, ge=1, le=100)
    webhook_backoff_seconds: float = Field(0.2, gt=0, le=3600)
    webhook_backoff_max_seconds: float = Field(60.0, gt=0, le=86400)


class MarketPipelineConfig(_Strict):
    warehouse: WarehouseConfig = WarehouseConfig()
    orchestration: OrchestrationConfig = OrchestrationConfig()
    control: ControlConfig = ControlConfig()
    adapter: AdapterConfig = AdapterConfig()
    loop: LoopConfig = LoopConfig()
    market: MarketConfig = MarketConfig()
    guardrails: GuardrailsConfig = GuardrailsConfig()
    scaling: ScalingConfigSection = ScalingConfigSection()
    telemetry: TelemetryConfig = TelemetryConfig()
    billing: BillingConfig = BillingConfig()
    demand_response: DemandResponseConfig = DemandResponseConfig()
    service: ServiceConfig = ServiceConfig()
    gpu_models: list[GpuModel] = Field(min_length=1)
    zones: list[Zone] = Field(min_length=1)
    pools: list[Pool] = Field(min_length=1)
    tenants: list[Tenant] = Field(default_factory=list)

    @model_validator(mode="after")
    def _references_resolve(self) -> "MarketPipelineConfig":
        models = {m.name for m in self.gpu_models}
        zones = {z.name for z in self.zones}
        for i, pool in enumerate(self.pools):
            if pool.gpu_model not in models:
                raise ValueError(f"pools.{i}.gpu_model: unknown GPU model {pool.gpu_model!r}")
            if pool.zone not in zones:
                raise ValueError(f"pools.{i}.zone: unknown zone {pool.zone!r}")
        ids = [p.pool_id for p in self.pools]
        if len(ids) != len(set(ids)):
            raise ValueError("pools: duplicate (gpu_model, zone) pair")
        for i, tenant in enumerate(self.tenants):
            for model in tenant.claims:
                if model not in models:
                    raise ValueError(f"tenants.{i}.claims.{model}: unknown GPU model")
        tenant_ids = [t.id for t in self.tenants]
        if len(tenant_ids) != len(set(tenant_ids)):
            raise ValueError("tenants: duplicate tenant id")
        if self.control.backend == "postgres" and not self.control_url:
            raise ValueError(
                "control.url: backend 'postgres' needs a PostgreSQL url (or a ducklake catalog_url)"
            )
        if self.adapter.state_store == "control" and self.control.backend != "postgres":
            raise ValueError("adapter.state_store: 'control' needs [control] backend = 'postgres'")
        return self

    @property
    def control_url(self) -> str:
        """The control PostgreSQL: `[control] url`, else the DuckLake's catalog."""
        return self.control.url or (
            self.warehouse.catalog_url if self.warehouse.backend == "ducklake" else ""
        )

    @cached_property
    def gpu_model_by_name(self) -> dict[str, GpuModel]:
        return {m.name: m for m in self.gpu_models}

    @cached_property
    def zone_by_name(self) -> dict[str, Zone]:
        return {z.name: z for z in self.zones}

    @cached_property
    def pool_by_id(self) -> dict[str, Pool]:
        return {p.pool_id: p for p in self.pools}

    def resolve_path(self, relative: str) -> Path:
        """A configured path, made absolute against MARKET_PIPELINE_HOME (or the cwd)."""
        path = Path(relative).expanduser()
        if path.is_absolute():
            return path
        return Path(os.environ.get(HOME_ENV, os.getcwd())) / path

    @property
    def warehouse_path(self) -> Path:
        return self.resolve_path(self.warehouse.path)

    @property
    def lake_data_path(self) -> str:
        """The DuckLake data path: a URL as given, a directory made absolute (with a trailing /)."""
        data = self.warehouse.data_path
        if "://" in data:
            return data
        return str(self.resolve_path(data)).rstrip("/") + "/"
