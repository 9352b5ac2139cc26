"""Parse and write market instances (JSON objects).

Accepted instance (unknown keys are rejected, so a typo is an error rather than a default)::

    {
      "resources": [{
        "name": str, "capacity": number >= 0 | null (unlimited), "unit_cost": number >= 0,
        "price_min": number > 0, "price_max": number >= price_min,
        # optional:
        "class": "guaranteed" | "drainable"         (default "guaranteed"),
        "pool": str        (pairs a drainable resource with the guaranteed one of its pool;
                            default "<gpu_model>/<zone>" when both are given, else the name),
        "gpu_model": str, "zone": str,
        "discount_band": [min, max]   (drainable only; default the instance-level band)
      }],
      "tenants": [{
        "id": str | int, "weight": [per resource] | {name: value} (missing = 0),
        "saturation": [per resource] | {name: value} (missing = 1) | number,
        "budget": number > 0 | null (no budget),
        # optional:
        "utility": "log" | "isoelastic" | "quadratic"   (default "log"),
        "eta": number > 0                 (required for isoelastic),
        "delay_cost": number | [per resource] | {name: value}   (default 0),
        "class": "elastic" | "rigid"      (default "elastic"),
        "drain_tolerant": bool            (default: class == "elastic"; rigid tenants never are),
        "multiplicity": number > 0        (identical tenants this row stands for, default 1)
      }],
      "drainable_discount_band": [min, max]   (optional, default [0.0, 0.9])
    }
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from market_pipeline.market.errors import InstanceError
from market_pipeline.market.population import TenantPopulation
from market_pipeline.market.resources import DRAINABLE, GUARANTEED, ResourceSet
from market_pipeline.market.utility import FAMILIES, ISOELASTIC, LOG

DEFAULT_BAND = (0.0, 0.9)
RESOURCE_KEYS = {
    "name",
    "capacity",
    "unit_cost",
    "price_min",
    "price_max",
    "class",
    "pool",
    "gpu_model",
    "zone",
    "discount_band",
}
TENANT_KEYS = {
    "id",
    "utility",
    "weight",
    "saturation",
    "budget",
    "eta",
    "delay_cost",
    "class",
    "drain_tolerant",
    "multiplicity",
}
TOP_KEYS = {"resources", "tenants", "drainable_discount_band"}


def _number(where: str, value: Any, *, allow_null: bool = False) -> float:
    if value is None and allow_null:
        return math.inf
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(float(value)):
        kind = "a finite number or null" if allow_null else "a finite number"
        raise InstanceError(f"{where}: expected {kind}, got {value!r}")
    return float(value)


def _band(where: str, value: Any) -> tuple[float, float]:
    if not isinstance(value, (list, tuple)) or len(value) != 2:
        raise InstanceError(f"{where}: expected [discount_min, discount_max], got {value!r}")
    low, high = _number(f"{where}[0]", value[0]), _number(f"{where}[1]", value[1])
    if not 0.0 <= low <= high < 1.0:
        raise InstanceError(f"{where}: need 0 <= discount_min <= discount_max < 1, got {value!r}")
    return low, high


def _check_keys(where: str, obj: Any, allowed: set[str], required: set[str]) -> None:
    if not isinstance(obj, dict):
        raise InstanceError(f"{where}: expected an object, got {type(obj).__name__}")
    unknown = sorted(set(obj) - allowed)
    if unknown:
        raise InstanceError(f"{where}: unknown field(s) {unknown}; accepted: {sorted(allowed)}")
    missing = sorted(required - set(obj))
    if missing:
        raise InstanceError(f"{where}: missing field(s) {missing}")


def parse_resources(items: Any, default_band: tuple[float, float]) -> ResourceSet:
    if not isinstance(items, list) or not items:
        raise InstanceError("resources: expected a non-empty list")
    names, classes, pools, bands, numbers = (
        [],
        [],
        [],
        [],
        {k: [] for k in ("capacity", "unit_cost", "price_min", "price_max")},
    )
    for i, item in enumerate(items):
        where = f"resources[{i}]"
        _check_keys(where, item, RESOURCE_KEYS, {"name", "capacity", "unit_cost", "price_min", "price_max"})
        name = item["name"]
        if not isinstance(name, str) or not name:
            raise InstanceError(f"{where}.name: expected a non-empty string, got {name!r}")
        names.append(name)
        for key in numbers:
            numbers[key].append(_number(f"{where}.{key}", item[key], allow_null=key == "capacity"))
        cls = item.get("class", GUARANTEED)
        if cls not in (GUARANTEED, DRAINABLE):
            raise InstanceError(f"{where}.class: expected 'guaranteed' or 'drainable', got {cls!r}")
        classes.append(cls)
        pool = item.get("pool")
        if pool is None:
            model, zone = item.get("gpu_model"), item.get("zone")
            pool = f"{model}/{zone}" if model is not None and zone is not None else name
        if not isinstance(pool, str) or not pool:
            raise InstanceError(f"{where}.pool: expected a non-empty string, got {pool!r}")
        pools.append(pool)
        if "discount_band" in item and cls != DRAINABLE:
            raise InstanceError(f"{where}.discount_band: only drainable resources have a discount band")
        bands.append(
            _band(f"{where}.discount_band", item["discount_band"])
            if "discount_band" in item
            else default_band
        )
    return ResourceSet(
        names=tuple(names),
        capacity=np.array(numbers["capacity"]),
        unit_cost=np.array(numbers["unit_cost"]),
        price_min=np.array(numbers["price_min"]),
        price_max=np.array(numbers["price_max"]),
        resource_class=tuple(classes),
        pool=tuple(pools),
        discount_min=np.array([b[0] for b in bands]),
        discount_max=np.array([b[1] for b in bands]),
    )


def _per_resource(where: str, value: Any, names: tuple[str, ...], missing: float | None) -> list[float]:
    m = len(names)
    if isinstance(value, dict) and missing is not None:
        unknown = sorted(set(value) - set(names))
        if unknown:
            raise InstanceError(f"{where}: unknown resource name(s) {unknown}")
        return [_number(f"{where}.{n}", value[n]) if n in value else missing for n in names]
    if isinstance(value, list):
        if len(value) != m:
            raise InstanceError(f"{where}: expected {m} values (one per resource), got {len(value)}")
        return [_number(f"{where}[{r}]", v) for r, v in enumerate(value)]
    raise InstanceError(
        f"{where}: expected a list of {m} numbers"
        + (" or an object keyed by resource name" if missing is not None else "")
    )


def parse_tenants(items: Any, resources: ResourceSet) -> TenantPopulation:
    if not isinstance(items, list) or not items:
        raise InstanceError("tenants: expected a non-empty list")
    names, m = resources.names, resources.size
    ids, families, weight, saturation, budget, eta, delay, tolerant, mult = ([] for _ in range(9))
    for i, item in enumerate(items):
        where = f"tenants[{i}]"
        _check_keys(where, item, TENANT_KEYS, {"id", "weight", "saturation", "budget"})
        tid = item["id"]
        if isinstance(tid, bool) or not isinstance(tid, (str, int)):
            raise InstanceError(f"{where}.id: expected a string or integer, got {tid!r}")
        ids.append(str(tid))
        where = f"tenants[{i}] (id {tid!r})"
        family = item.get("utility", LOG)
        if family not in FAMILIES:
            raise InstanceError(f"{where}.utility: expected one of {list(FAMILIES)}, got {family!r}")
        families.append(family)
        weight.append(_per_resource(f"{where}.weight", item["weight"], names, 0.0))
        sat = item["saturation"]
        saturation.append(
            [_number(f"{where}.saturation", sat)] * m
            if isinstance(sat, (int, float)) and not isinstance(sat, bool)
            else _per_resource(f"{where}.saturation", sat, names, 1.0)
        )
        budget.append(_number(f"{where}.budget", item["budget"], allow_null=True))
        if family == ISOELASTIC and "eta" not in item:
            raise InstanceError(f"{where}.eta: required for isoelastic tenants")
        eta.append(_number(f"{where}.eta", item["eta"]) if "eta" in item else 1.0)
        cost = item.get("delay_cost", 0.0)
        delay.append(
            [_number(f"{where}.delay_cost", cost)] * m
            if isinstance(cost, (int, float)) and not isinstance(cost, bool)
            else _per_resource(f"{where}.delay_cost", cost, names, 0.0)
        )
        cls = item.get("class", "elastic")
        if cls not in ("elastic", "rigid"):
            raise InstanceError(f"{where}.class: expected 'elastic' or 'rigid', got {cls!r}")
        drain = item.get("drain_tolerant", cls == "elastic")
        if not isinstance(drain, bool):
            raise InstanceError(f"{where}.drain_tolerant: expected true or false, got {drain!r}")
        if drain and cls == "rigid":
            raise InstanceError(f"{where}.drain_tolerant: a rigid tenant cannot be drain tolerant")
        tolerant.append(drain)
        mult.append(_number(f"{where}.multiplicity", item.get("multiplicity", 1.0)))
    if len(set(ids)) != len(ids):
        dup = next(t for t in ids if ids.count(t) > 1)
        raise InstanceError(f"tenants.id: duplicate id {dup!r}")
    delay_arr = np.array(delay)
    mult_arr = np.array(mult)
    return TenantPopulation.build(
        ids=ids,
        families=families,
        weight=np.array(weight),
        saturation=np.array(saturation),
        budget=np.array(budget),
        drainable_mask=resources.drainable_mask,
        eta=np.array(eta),
        delay_cost=delay_arr if np.any(delay_arr != 0) else None,
        multiplicity=mult_arr if np.any(mult_arr != 1) else None,
        drain_tolerant=np.array(tolerant),
    )


def parse_instance(data: Any) -> tuple[ResourceSet, TenantPopulation]:
    """The instance's resources and tenants; `MarketProblem.from_instance_json` joins them
    (so this module needs no import of problem.py, which imports it)."""
    _check_keys("instance", data, TOP_KEYS, {"resources", "tenants"})
    band = (
        _band("drainable_discount_band", data["drainable_discount_band"])
        if "drainable_discount_band" in data
        else DEFAULT_BAND
    )
    resources = parse_resources(data["resources"], band)
    return resources, parse_tenants(data["tenants"], resources)


def _json_number(value: float) -> float | None:
    return float(value) if math.isfinite(value) else None


def instance_json(problem) -> dict:
    """The instance as a JSON-able dict (tenants in population order)."""
    res, pop = problem.resources, problem.tenants
    resources = []
    for r, name in enumerate(res.names):
        item = {
            "name": name,
            "capacity": _json_number(res.capacity[r]),
            "unit_cost": float(res.unit_cost[r]),
            "price_min": float(res.price_min[r]),
            "price_max": float(res.price_max[r]),
            "class": res.resource_class[r],
            "pool": res.pool[r],
        }
        if res.resource_class[r] == DRAINABLE:
            item["discount_band"] = [float(res.discount_min[r]), float(res.discount_max[r])]
        resources.append(item)
    tenants = []
    families = pop.families
    w, s = pop.weight.numpy(), pop.saturation.numpy()
    for j, tid in enumerate(pop.ids):
        item = {
            "id": tid,
            "utility": families[j],
            "weight": w[j].tolist(),
            "saturation": s[j].tolist(),
            "budget": _json_number(float(pop.budget[j])),
            "drain_tolerant": bool(pop.drain_tolerant[j]),
        }
        if families[j] == ISOELASTIC:
            item["eta"] = float(pop.eta[j])
        if pop.delay_cost is not None:
            item["delay_cost"] = pop.delay_cost[j].tolist()
        if pop.multiplicity is not None:
            item["multiplicity"] = float(pop.multiplicity[j])
        tenants.append(item)
    return {"resources": resources, "tenants": tenants}
