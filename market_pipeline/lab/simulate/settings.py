"""Settings of a simulation run and the economic assumptions it rests on.

Every number that shapes the result is here, with where it comes from. The same settings
apply to every pricing strategy of a run; nothing is tuned per strategy.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

from market_pipeline.config import MarketPipelineConfig
from market_pipeline.fleet.workload import WorkloadParams
from market_pipeline.gpus.catalog import load_gpu_catalog, unpriced_model_message
from market_pipeline.lab.simulate.errors import SimulationInputError
from market_pipeline.tick.promises import Promises

STRATEGY_NAMES = ("static", "utilization", "stackelberg", "clairvoyant", "claims", "premium")
DEFAULT_STRATEGIES = ("static", "utilization", "stackelberg")
PLACEMENT_NAMES = ("round_robin", "best_fit", "fragment_aware")


@dataclass(frozen=True)
class EconomicAssumptions:
    """How tenants respond to prices, and the platform's price rules.

    Calibration (one procedure for every strategy, `tenants.calibrate`): at the list price
    every tenant demands exactly its share of the trace's load; its local price elasticity
    there is `elastic_elasticity` or `rigid_elasticity` (spread evenly by +-`elasticity_spread`
    over the tenants of a class); its budget is (1 + `budget_headroom`) times its spend at the
    list price. `elastic_elasticity` = 2 is the Lerner condition (p - c)/p = 1/e at the list
    price with unit cost = half the list price (the configured pools' cost/base ratio): the
    list price is assumed to be the best uniform price for the elastic segment, so a lower
    drainable price has to earn its keep through volume.

    What these bound: a trace tenant never spends more than (1 + `budget_headroom`) x its
    list-price spend; the rigid price is capped at `guaranteed_cap`. Revenue above that comes
    from the latent elastic pool (`latent_elastic_ratio`), which the leader reaches by
    discounting the drainable class when capacity is idle (`avoidable_cost_share`: idle GPUs
    are sunk cost on a fixed fleet). Without that pool, openb's elastic share of GPU-hours
    (17%) caps any strategy at about +8% revenue over static (measured: +4%).
    """

    elastic_qos: tuple[str, ...] = ("BE", "Burstable")
    rigid_qos: tuple[str, ...] = ("LS", "Guaranteed")
    tenants_per_class: int = 16
    elastic_elasticity: float = 2.0
    rigid_elasticity: float = 0.2
    elasticity_spread: float = 0.25
    budget_headroom: float = 0.25
    unit_cost_share: float = 0.5  # unit cost / list price where the config has no cost
    # Share of the unit cost (TCO per powered GPU-hour) that selling a GPU-hour adds; the
    # leader prices against it, profit charges the rest on the powered capacity, sold or
    # idle (every strategy alike). The simulated fleet is fixed and always powered (no
    # scaler runs in the simulator), so capex, space and idle power are sunk: only the
    # energy of a busy over an idle GPU is avoidable, (TDP - idle) x PUE x energy price,
    # e.g. A100 (400 - 55) W x 1.3 x 0.10 $/kWh = 0.045 $/h, ~4% of the config's 1.20 $/h;
    # for the TDP-priced openb models (unit cost = 0.5 x 0.7/150 $/W-h x TDP) 1.3 x 0.10 $/kWh x
    # (TDP - idle) / (0.0023 $/W-h x TDP) = 4.5-5%. Hence 0.05. The live pipeline's solver sees
    # the full configured cost because its scaler can power idle nodes down; 1.0 reproduces
    # that here (then the list price is the elastic segment's best price, see above, and the
    # leader never fills idle GPUs by discounting). With a latent elastic pool the leader's
    # problem stays strictly monotone below the band and the solves converge (7 days on
    # openb + Helios: 240/240); without one (`latent_elastic_ratio` 0) budgets bind, profit
    # is near flat below the binding price, and most solves fall back to the last prices.
    avoidable_cost_share: float = 0.05
    # Price bounds relative to the list price (median of the configured pools' ratios when None).
    price_floor: float | None = None
    price_ceiling: float | None = None
    # Cap on the guaranteed class relative to the list price: the platform's promise to rigid
    # tenants (they pay at most about 5% more for the assurance of never being drained). It bounds
    # the solver's price_max for the guaranteed class, the backlog shield's price and the
    # utilisation-based premium alike. None: the billing peak time coefficient instead.
    # 4%, not 5%: a rigid GPU-hour's average price also moves with the pool mix (list prices
    # differ 4x between pools, and drains free room for rigid work in some pools more than
    # others); at a 5% cap on every pool the mix alone took the average to 1.0507x static
    # (openb + Helios, 7 days, seed 0), so the promise keeps a point of margin for it.
    guaranteed_cap: float | None = None  # None: the config's market.guaranteed_price_cap (1.04)
    # Elastic work (drain tolerant, delay insensitive: batch training, sweeps) that does not
    # buy at a tick's price is deferred, not lost: it waits in its tenant's backlog and is
    # submitted at the first later tick whose price it accepts, for up to this many hours
    # (one daily cycle: off-peak comes round within it). 0: priced-out work is lost.
    elastic_patience_hours: float = 24.0
    # Latent elastic demand (`tenants.add_latent`): elastic work that exists but is priced out
    # at the list price: sweeps, backfill training and batch inference that run on spot /
    # preemptible capacity in real clouds at a discount and not at all at list. The trace
    # cannot show it (it records what ran at the price charged), so static pricing, which
    # never charges less than list, sees none of it and still reproduces the trace exactly.
    # Each elastic tenant gets a latent twin with the same job mix and curvature, choke price
    # = the list price, sized so that at half the list price it wants this many times its
    # twin's list-price demand. NOT identified by the data: it is the assumption the seed's
    # claim (utilisation 65% -> 80%+ by filling idle GPUs off-peak) rests on. 1.0 = "as much
    # again as the trace's elastic work, at a 50% discount"; 0 disables it (the trace alone).
    latent_elastic_ratio: float = 1.0
    # The tenants' elasticity swings by +-this share over the day (most elastic at 03:00,
    # `tenants.tod_factor`): the hidden truth varies by time of day, which an hour-of-day
    # fixed effect does not remove from a single own-price elasticity (the fit averages it).
    elasticity_tod_swing: float = 0.3
    utilization_threshold: float = 0.85  # the usual utilisation-pricing rule: a premium from 85%
    utilization_doubling: float = 0.15  # ... and doubles the price 15 points above it
    packing_efficiency: float = 0.95  # share of a pool the engine may sell (fragmentation)

    def __post_init__(self) -> None:
        checks = {
            "tenants_per_class": self.tenants_per_class >= 1,
            "elastic_elasticity": 0 < self.elastic_elasticity <= 20,
            "rigid_elasticity": 0 <= self.rigid_elasticity <= 20,
            "elasticity_tod_swing": 0 <= self.elasticity_tod_swing < 1,
            "elasticity_spread": 0 <= self.elasticity_spread < 1,
            "budget_headroom": self.budget_headroom > 0,
            "unit_cost_share": 0 <= self.unit_cost_share < 1,
            "avoidable_cost_share": 0 <= self.avoidable_cost_share <= 1,
            "price_floor": self.price_floor is None or 0 < self.price_floor <= 1,
            "price_ceiling": self.price_ceiling is None or self.price_ceiling >= 1,
            "guaranteed_cap": self.guaranteed_cap is None or self.guaranteed_cap >= 1,
            "elastic_patience_hours": 0 <= self.elastic_patience_hours <= 24 * 31,
            "latent_elastic_ratio": 0 <= self.latent_elastic_ratio <= 10,
            "utilization_threshold": 0 < self.utilization_threshold < 1,
            "utilization_doubling": self.utilization_doubling > 0,
            "packing_efficiency": 0 < self.packing_efficiency <= 1,
        }
        for name, ok in checks.items():
            if not ok:
                raise SimulationInputError(
                    f"economic assumption {name}={getattr(self, name)!r} is out of range"
                )
        overlap = set(self.elastic_qos) & set(self.rigid_qos)
        if overlap:
            raise SimulationInputError(
                f"economic assumptions: QoS {sorted(overlap)} is both elastic and rigid"
            )


OPENINGS = ("own", "list")


@dataclass(frozen=True)
class SimulationSettings:
    days: float = 7.0
    tick_minutes: int = 60
    seed: int = 0
    strategies: tuple[str, ...] = DEFAULT_STRATEGIES
    placement_policy: str = "best_fit"  # the policy the strategy runs place jobs with
    load_start_day: float = 14.0  # the days before it are the forecaster's history
    # Days of the load trace just before the window that every strategy runs through first,
    # unmeasured (standard discrete-event warm-up): the jobs running at time 0 are the steady
    # state of the list-price demand (`arrivals.initial_population`), which is static's steady
    # state but not a repricing strategy's; long jobs (openb's carry GPU-hours for days) take
    # days to reach the new one. Same for every strategy; at most `load_start_day` (the trace
    # before the window) is used; 0 measures from the opening state.
    warmup_days: float = 3.0
    # Mean demand / capacity at the list price; the load trace gives its shape over time.
    # None: the simulated adapter's workload target (`fleet.workload.WorkloadParams`).
    target_utilization: float | None = None
    forecast_every_ticks: int = 6
    rigid_sla_wait_s: float | None = None  # None: the longest a task drain may take (config)
    economics: EconomicAssumptions = field(default_factory=EconomicAssumptions)
    # The Stackelberg strategy does not read `economics`' tenant response (the hidden truth):
    # it prices with the claims below as the prior, learns the response from its own prices
    # and the demand they met (`simulate.learning`), and dithers its prices by bounded
    # experiments. The claims are the aggregate truth grid's (`lab.demand_response.truth_grid`),
    # fixed before this work: elastic 2.0 (sd 1.0), rigid 0.2 (sd 0.3). `learn_response`
    # False prices with the claims alone (no fit, no experiment); the strategy "clairvoyant"
    # runs the same tick on the true population hour by hour (the regret's yardstick); the
    # strategy "claims" is the tick on the claims alone beside them (the ablation).
    learn_response: bool = True
    claims_elastic: tuple[float, float] = (2.0, 1.0)
    claims_rigid: tuple[float, float] = (0.2, 0.3)
    refit_every_ticks: int = 6
    experiment_amplitude: float = 0.05
    # Where every strategy's run starts (`opening`): "own", the steady state of the strategy's
    # own opening prices (comparing each strategy with static in its own steady state); "list",
    # the list-price steady state for all, the prices in force the list prices (comparing
    # strategies from one state: the truth grid's regret, where a learner's own opening is the
    # claims' and openb's long jobs would carry it through the measured days).
    opening: str = "own"

    def __post_init__(self) -> None:
        if self.opening not in OPENINGS:
            raise SimulationInputError(f"opening {self.opening!r}: choose from {list(OPENINGS)}")
        if self.refit_every_ticks < 1 or not 0 < self.experiment_amplitude <= 0.25:
            raise SimulationInputError("refit_every_ticks must be >= 1 and experiment_amplitude in (0, 0.25]")
        if not 0 < self.days <= 31:
            raise SimulationInputError(f"days={self.days}: must be in (0, 31]")
        if self.tick_minutes < 1 or 1440 % self.tick_minutes:
            raise SimulationInputError(f"tick_minutes={self.tick_minutes}: must divide a day")
        unknown = [s for s in self.strategies if s not in STRATEGY_NAMES]
        if unknown or not self.strategies:
            raise SimulationInputError(f"strategies {unknown or '[]'}: choose from {list(STRATEGY_NAMES)}")
        if self.placement_policy not in PLACEMENT_NAMES:
            raise SimulationInputError(
                f"placement policy {self.placement_policy!r}: choose from {list(PLACEMENT_NAMES)}"
            )
        if not 0 <= self.warmup_days <= 31:
            raise SimulationInputError(f"warmup_days={self.warmup_days}: must be in [0, 31]")
        if self.load_start_day < 0 or self.forecast_every_ticks < 1:
            raise SimulationInputError("load_start_day must be >= 0 and forecast_every_ticks >= 1")
        if self.target_utilization is not None and not 0 < self.target_utilization <= 2:
            raise SimulationInputError(f"target_utilization={self.target_utilization}: must be in (0, 2]")

    @property
    def load_target(self) -> float:
        return (
            self.target_utilization
            if self.target_utilization is not None
            else WorkloadParams().target_utilisation
        )

    @property
    def ticks(self) -> int:
        return int(math.ceil(self.days * 1440 / self.tick_minutes))

    @property
    def warmup_ticks(self) -> int:
        return int(round(min(self.warmup_days, self.load_start_day) * 1440 / self.tick_minutes))

    @property
    def tick_seconds(self) -> float:
        return self.tick_minutes * 60.0

    def with_(self, **changes: Any) -> "SimulationSettings":
        return replace(self, **changes)


@dataclass(frozen=True)
class PoolPrices:
    """The list price and the price rules of one pool (GPU model)."""

    model: str
    list_price: float
    unit_cost: float  # TCO per powered GPU-hour
    serve_cost: float  # the part of it a sold GPU-hour adds (what the leader prices against)
    price_min: float
    price_max: float  # any class
    guaranteed_max: float
    discount_min: float
    discount_max: float


def _median(values: list[float], default: float) -> float:
    if not values:
        return default
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else 0.5 * (ordered[mid - 1] + ordered[mid])


def pool_prices(
    models: tuple[str, ...], config: MarketPipelineConfig, economics: EconomicAssumptions
) -> tuple[PoolPrices, ...]:
    """List price, unit cost and bounds per GPU model: a configured pool's own numbers where
    the config has one, else the shipped GPU catalog's list price (`gpus.catalog`) with
    the configured pools' median ratios as bounds and `unit_cost_share` of it as cost."""
    floor = economics.price_floor or _median([p.price_min / p.base_price for p in config.pools], 0.4)
    ceiling = economics.price_ceiling or _median([p.price_max / p.base_price for p in config.pools], 4.0)
    promises = Promises.from_config(config, guaranteed_cap=economics.guaranteed_cap)
    out = []
    for model in models:
        pool = next((p for p in config.pools if p.gpu_model == model), None)
        gpu = config.gpu_model_by_name.get(model)
        if pool is not None:
            price, low, high = pool.base_price, pool.price_min, pool.price_max
        else:
            entry = load_gpu_catalog().lookup(model)
            if entry is None:
                raise SimulationInputError(unpriced_model_message(model, "of the simulation"))
            price = entry.list_price_per_gpu_hour
            low, high = floor * price, ceiling * price
        cost = gpu.cost_per_gpu_hour if gpu is not None else economics.unit_cost_share * price
        out.append(
            PoolPrices(
                model,
                price,
                cost,
                economics.avoidable_cost_share * cost,
                low,
                high,
                promises.guaranteed_ceiling(price, high),
                promises.discount_min,
                promises.discount_max,
            )
        )
    return tuple(out)
