"""The market a fleet implies: pools (GPU model x zone), priced GPU models and tenants, for any
node list (openb, Alibaba spot) as well as for the config's own pools.

`resolve_fleet_market(config)` returns the config the rest of the loop reads, so pricing,
scaling, metering and billing all see the same pools:
- `adapter.fleet_source = "config"`: the config as it is.
- a node list: one pool per (GPU model, zone) of the list's GPU nodes, sized from the list
  (every node powered, `max_nodes` = the nodes there are, `gpus_per_node` = the largest
  node), priced from the config's `[[gpu_models]]` or else the shipped GPU catalog
  (`gpu_catalog.toml`), with price bounds at the configured pools' median ratios to their
  base price. A model neither prices is `UnpricedModelError`: a startup error, never a
  billing failure.
- tenants (`adapter.tenants_source`): "config", "workload" (derived from the workload's
  job shapes: QoS class x size, `workload_tenants`), or "auto": the configured tenants
  when they claim every GPU model of the fleet, the workload's otherwise.
"""

from __future__ import annotations

import statistics
from collections import defaultdict

import numpy as np
from pydantic import ValidationError

from market_pipeline.config.model import Claim, ConfigError, GpuModel, MarketPipelineConfig, Pool, Tenant
from market_pipeline.fleet.catalog import FleetSourceError, NodeSpec, build_catalog
from market_pipeline.fleet.shapes import QOS_VALUES, WorkloadError, load_shapes
from market_pipeline.fleet.workload import ELASTIC_QOS, STREAM_BUILTIN, WorkloadParams
from market_pipeline.gpus.catalog import UnpricedModelError, load_gpu_catalog, unpriced_model_message

MAX_GPUS_PER_NODE = 16
# Derived tenants: drain risk per GPU-hour as a share of the fleet's mean list price (the
# configured tenants' values relative to the configured list prices), and budget headroom
# over the spend at list price.
ELASTIC_DELAY_SHARE = 0.02
RIGID_DELAY_SHARE = 0.25
BUDGET_HEADROOM = 0.5


# resolved fleet markets by config (a node list is read once per process, not per asset)
_FLEET_MARKETS: dict[str, MarketPipelineConfig] = {}


def fleet_market(config: MarketPipelineConfig) -> MarketPipelineConfig:
    """`resolve_fleet_market`, once per distinct config; any problem is one ConfigError line."""
    key = config.model_dump_json()
    if key not in _FLEET_MARKETS:
        try:
            _FLEET_MARKETS[key] = resolve_fleet_market(config)
        except (UnpricedModelError, FleetSourceError, WorkloadError, ValidationError) as exc:
            raise ConfigError(str(exc).splitlines()[0]) from None
    return _FLEET_MARKETS[key]


def resolve_fleet_market(config: MarketPipelineConfig) -> MarketPipelineConfig:
    """The config with the pools, GPU models and tenants of its fleet (see the module doc)."""
    if config.adapter.fleet_source == "config" or config.adapter.backend != "simulated":
        return config
    nodes = [n for n in build_catalog(config).nodes if n.gpus > 0]
    if not nodes:
        raise UnpricedModelError(f"fleet {config.adapter.fleet_source}: the node list holds no GPU node")
    models = _priced_models(config, sorted({n.gpu_model for n in nodes}))
    pools = _pools(config, nodes, {m.name: m for m in models})
    tenants = _tenants(config, pools, {m.name: m for m in models})
    # validated anew (not model_copy): the references between pools, models and tenants hold
    return type(config).model_validate(
        {
            **config.model_dump(),
            "gpu_models": [m.model_dump() for m in models],
            "pools": [p.model_dump() for p in pools],
            "tenants": [t.model_dump() for t in tenants],
        }
    )


def _priced_models(config: MarketPipelineConfig, fleet_models: list[str]) -> list[GpuModel]:
    """The configured models, plus a catalog entry for every fleet model the config lacks."""
    configured = {m.name: m for m in config.gpu_models}
    catalog = load_gpu_catalog()
    out = list(config.gpu_models)
    for name in fleet_models:
        if name in configured:
            continue
        entry = catalog.lookup(name)
        if entry is None:
            raise UnpricedModelError(unpriced_model_message(name, config.adapter.fleet_source))
        out.append(
            GpuModel(
                name=name,
                memory_mib=entry.memory_mib,
                cost_per_gpu_hour=entry.cost_per_gpu_hour,
                list_price_per_gpu_hour=entry.list_price_per_gpu_hour,
                mig_profiles=list(entry.mig_profiles),
                nvlink=entry.nvlink,
                source=f"catalog ({entry.source})",
            )
        )
    return out


def list_price(model: GpuModel, config: MarketPipelineConfig) -> float:
    """A model's list price per GPU-hour: its own, else a configured pool's base price, else the
    catalog's."""
    if model.list_price_per_gpu_hour is not None:
        return model.list_price_per_gpu_hour
    pool = next((p for p in config.pools if p.gpu_model == model.name), None)
    if pool is not None:
        return pool.base_price
    entry = load_gpu_catalog().lookup(model.name)
    if entry is None:
        raise UnpricedModelError(unpriced_model_message(model.name, config.adapter.fleet_source))
    return entry.list_price_per_gpu_hour


def _ratio(config: MarketPipelineConfig, attr: str, default: float) -> float:
    ratios = [getattr(p, attr) / p.base_price for p in config.pools]
    return statistics.median(ratios) if ratios else default


def _pools(config: MarketPipelineConfig, nodes: list[NodeSpec], models: dict[str, GpuModel]) -> list[Pool]:
    floor, ceiling = _ratio(config, "price_min", 0.4), _ratio(config, "price_max", 4.0)
    by_pool: dict[tuple[str, str], list[NodeSpec]] = defaultdict(list)
    for node in nodes:
        by_pool[(node.gpu_model, node.zone)].append(node)
    pools = []
    for (model, zone), members in sorted(by_pool.items()):
        price = list_price(models[model], config)
        pools.append(
            Pool(
                gpu_model=model,
                zone=zone,
                nodes=len(members),
                max_nodes=len(members),
                warm_nodes=0,
                gpus_per_node=min(MAX_GPUS_PER_NODE, max(n.gpus for n in members)),
                price_min=round(floor * price, 6),
                price_max=round(ceiling * price, 6),
                base_price=price,
            )
        )
    return pools


def _tenants(config: MarketPipelineConfig, pools: list[Pool], models: dict[str, GpuModel]) -> list[Tenant]:
    source = config.adapter.tenants_source
    fleet_models = {p.gpu_model for p in pools}
    claimed = {m for t in config.tenants for m in t.claims}
    if source == "config" or (source == "auto" and config.tenants and fleet_models <= claimed):
        return list(config.tenants)
    shapes = load_shapes(
        config.adapter.workload_source,
        np.random.default_rng([config.adapter.seed, STREAM_BUILTIN]),
        config.resolve_path,
    )
    gpu_hours = shapes.num_gpu * (shapes.gpu_milli / 1000.0) * shapes.lifetime_s / 3600.0
    return workload_tenants(shapes.qos, shapes.num_gpu, gpu_hours, pools, models, config)


def workload_tenants(
    qos: np.ndarray,
    num_gpu: np.ndarray,
    gpu_hours: np.ndarray,
    pools: list[Pool],
    models: dict[str, GpuModel],
    config: MarketPipelineConfig,
) -> list[Tenant]:
    """One tenant per (QoS class, size) cell of the workload's GPU jobs: BE and Burstable are
    elastic and drain tolerant, LS and Guaranteed rigid; a job of one GPU or less is "single",
    of more "multi". A tenant's claim on a model is its cell's share of the GPU-hours times the
    load the workload puts on that model's GPUs at list price (WorkloadParams.target_utilisation),
    as its saturation, with weight 2 x list price x saturation: at list price it buys its
    saturation, with price elasticity 2 (log utility)."""
    gpu_jobs = num_gpu > 0
    if not gpu_jobs.any() or gpu_hours[gpu_jobs].sum() <= 0:
        raise UnpricedModelError(
            f"workload {config.adapter.workload_source}: no GPU job to derive tenants from"
        )
    load = WorkloadParams().target_utilisation
    gpus_by_model: dict[str, float] = defaultdict(float)
    for pool in pools:
        gpus_by_model[pool.gpu_model] += pool.nodes * pool.gpus_per_node
    prices = {m: list_price(models[m], config) for m in gpus_by_model}
    mean_price = float(np.mean(list(prices.values())))
    total = float(gpu_hours[gpu_jobs].sum())
    tenants = []
    for code, qos_name in enumerate(QOS_VALUES):
        for size, rows in (("single", gpu_jobs & (num_gpu <= 1)), ("multi", num_gpu > 1)):
            share = float(gpu_hours[rows & (qos == code)].sum()) / total
            if share <= 1e-6:
                continue
            elastic = qos_name in ELASTIC_QOS
            claims = {
                m: Claim(
                    weight=2.0 * prices[m] * max(share * load * g, 1e-3),
                    saturation=max(share * load * g, 1e-3),
                )
                for m, g in gpus_by_model.items()
            }
            spend = sum(prices[m] * c.saturation for m, c in claims.items())
            tenants.append(
                Tenant(
                    id=f"{qos_name.lower()}-{size}",
                    kind="elastic" if elastic else "rigid",
                    drain_tolerant=elastic,
                    budget_per_hour=(1.0 + BUDGET_HEADROOM) * spend,
                    delay_sensitivity=(ELASTIC_DELAY_SHARE if elastic else RIGID_DELAY_SHARE) * mean_price,
                    claims=claims,
                )
            )
    return tenants
