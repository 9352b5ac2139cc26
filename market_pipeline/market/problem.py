"""A market instance: the resources the leader prices and the tenant population."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from market_pipeline.market.errors import InstanceError
from market_pipeline.market.instance import instance_json, parse_instance
from market_pipeline.market.population import TenantPopulation
from market_pipeline.market.resources import ResourceSet


@dataclass(frozen=True, eq=False)
class MarketProblem:
    resources: ResourceSet
    tenants: TenantPopulation

    def __post_init__(self) -> None:
        if self.tenants.num_resources != self.resources.size:
            raise InstanceError(
                f"tenants.weight: {self.tenants.num_resources} resources per tenant, "
                f"but the instance has {self.resources.size}"
            )

    @staticmethod
    def from_instance_json(data: Mapping[str, Any]) -> "MarketProblem":
        """Build from the instance JSON object (see ``market_pipeline.market.instance``)."""
        return MarketProblem(*parse_instance(data))

    def to_instance_json(self) -> dict:
        return instance_json(self)

    @property
    def resource_names(self) -> tuple[str, ...]:
        return self.resources.names

    def with_demand_scale(self, scale: float | np.ndarray | Mapping[str, float]) -> "MarketProblem":
        """The population shifted by a demand forecast: scale[r] = forecast / current demand
        level of resource r (a number for all, an array in resource order, or a mapping by
        resource name with 1 for names left out). Each tenant's appetite for r is stretched,
        U_jr(d) -> k_r U_jr(d / k_r), so at fixed prices and budget multiplier the demand for r
        scales by exactly k_r; budgets scale by the weight-weighted mean of k (exact for a
        uniform k). See ``TenantPopulation.with_demand_scale``."""
        m = self.resources.size
        if isinstance(scale, Mapping):
            unknown = sorted(set(scale) - set(self.resources.names))
            if unknown:
                raise InstanceError(f"demand scale: unknown resource name(s) {unknown}")
            vector = np.array([float(scale.get(n, 1.0)) for n in self.resources.names])
        else:
            vector = np.broadcast_to(np.asarray(scale, dtype=np.float64), (m,)).copy()
        return MarketProblem(self.resources, self.tenants.with_demand_scale(vector))
