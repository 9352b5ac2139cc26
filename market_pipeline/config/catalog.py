"""The market's catalog in the configuration: GPU models (with their cost and list price),
zones, pools (GPU model x zone) and tenants with their claims. `config.MarketPipelineConfig`
holds them next to the loop's settings and checks that they reference each other."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class GpuModel(_Strict):
    name: str = Field(min_length=1)
    memory_mib: int = Field(gt=0)
    cost_per_gpu_hour: float = Field(gt=0)
    mig_profiles: list[str] = Field(default_factory=list)
    nvlink: bool = False
    # product names the driver reports for this model (NVML / dcgm-exporter modelName), for
    # names the token rule in hardware.naming does not resolve
    device_names: list[str] = Field(default_factory=list)
    # the list price per GPU-hour; None: the base price of the model's configured pool
    list_price_per_gpu_hour: float | None = Field(None, gt=0)
    source: str = "config"  # where the figures come from (the shipped catalog names its rule)


class Zone(_Strict):
    name: str = Field(min_length=1)
    location_coefficient: float = Field(gt=0)


class Pool(_Strict):
    gpu_model: str
    zone: str
    nodes: int = Field(ge=0)
    gpus_per_node: int = Field(ge=1, le=16)
    warm_nodes: int = Field(0, ge=0)
    max_nodes: int = Field(ge=0)
    price_min: float = Field(gt=0)
    price_max: float = Field(gt=0)
    base_price: float = Field(gt=0)

    @property
    def pool_id(self) -> str:
        return f"{self.gpu_model}@{self.zone}"

    @model_validator(mode="after")
    def _bounds(self) -> "Pool":
        if not self.price_min <= self.base_price <= self.price_max:
            raise ValueError("need price_min <= base_price <= price_max")
        if self.max_nodes < self.nodes:
            raise ValueError("max_nodes must be >= nodes")
        return self


class Claim(_Strict):
    weight: float = Field(gt=0)
    saturation: float = Field(gt=0)


class Tenant(_Strict):
    id: str = Field(min_length=1)
    kind: Literal["elastic", "rigid"]
    drain_tolerant: bool
    budget_per_hour: float = Field(gt=0)
    delay_sensitivity: float = Field(0.0, ge=0)
    claims: dict[str, Claim]
