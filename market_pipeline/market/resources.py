"""The resources the leader prices: r = (gpu_model, zone, class), unit GPU-hour.

A *pool* is a (gpu_model, zone) pair; it may sell a guaranteed and a drainable class. The
drainable class of a pool is priced inside a discount band relative to the guaranteed one:
(1 - discount_max) * p_guaranteed <= p_drainable <= (1 - discount_min) * p_guaranteed.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from market_pipeline.market.errors import InstanceError

GUARANTEED = "guaranteed"
DRAINABLE = "drainable"
RESOURCE_CLASSES = (GUARANTEED, DRAINABLE)


@dataclass(frozen=True, eq=False)
class BandPair:
    """A drainable resource tied to the guaranteed resource of the same pool."""

    guaranteed: int
    drainable: int
    discount_min: float
    discount_max: float


@dataclass(frozen=True, eq=False)
class ResourceSet:
    names: tuple[str, ...]
    capacity: np.ndarray  # GPU-hours per interval; inf = unlimited
    unit_cost: np.ndarray
    price_min: np.ndarray
    price_max: np.ndarray
    resource_class: tuple[str, ...]
    pool: tuple[str, ...]
    discount_min: np.ndarray  # only meaningful for drainable resources
    discount_max: np.ndarray

    def __post_init__(self) -> None:
        m = len(self.names)
        if m == 0:
            raise InstanceError("resources: at least one resource is required")
        if len(set(self.names)) != m:
            raise InstanceError(f"resources.name: names must be unique, got {list(self.names)}")
        for field in ("capacity", "unit_cost", "price_min", "price_max", "discount_min", "discount_max"):
            values = np.asarray(getattr(self, field), dtype=np.float64)
            if values.shape != (m,):
                raise InstanceError(f"resources.{field}: expected {m} values, got shape {values.shape}")
            object.__setattr__(self, field, values)
        for field in ("resource_class", "pool"):
            if len(getattr(self, field)) != m:
                raise InstanceError(f"resources.{field}: expected {m} values")
        self._validate_values()
        object.__setattr__(self, "_band_pairs", self._pair_pools())

    def _validate_values(self) -> None:
        def bad(field: str, mask: np.ndarray, rule: str) -> None:
            if mask.any():
                names = [self.names[i] for i in np.flatnonzero(mask)]
                raise InstanceError(f"resources.{field}: must be {rule} (resources {names})")

        bad("capacity", np.isnan(self.capacity) | (self.capacity < 0), ">= 0 (null = unlimited)")
        bad("unit_cost", ~np.isfinite(self.unit_cost) | (self.unit_cost < 0), "finite and >= 0")
        # A zero price makes log/isoelastic demand unbounded, so prices stay strictly positive.
        bad("price_min", ~np.isfinite(self.price_min) | (self.price_min <= 0), "finite and > 0")
        bad(
            "price_max",
            ~np.isfinite(self.price_max) | (self.price_max < self.price_min),
            "finite and >= price_min",
        )
        bad("discount_min", ~(self.discount_min >= 0) | ~(self.discount_min < 1), "in [0, 1)")
        bad(
            "discount_max",
            ~(self.discount_max >= self.discount_min) | ~(self.discount_max < 1),
            "in [discount_min, 1)",
        )
        for i, cls in enumerate(self.resource_class):
            if cls not in RESOURCE_CLASSES:
                raise InstanceError(
                    f"resources.class: {cls!r} for {self.names[i]!r} is not one of {RESOURCE_CLASSES}"
                )

    def _pair_pools(self) -> tuple[BandPair, ...]:
        guaranteed_of: dict[str, int] = {}
        for i, (cls, pool) in enumerate(zip(self.resource_class, self.pool)):
            if cls == GUARANTEED:
                if pool in guaranteed_of:
                    other = self.names[guaranteed_of[pool]]
                    raise InstanceError(
                        f"resources.pool: pool {pool!r} has two guaranteed resources ({other!r}, {self.names[i]!r})"
                    )
                guaranteed_of[pool] = i
        pairs = []
        for i, (cls, pool) in enumerate(zip(self.resource_class, self.pool)):
            if cls == DRAINABLE and pool in guaranteed_of:
                g = guaranteed_of[pool]
                pairs.append(BandPair(g, i, float(self.discount_min[i]), float(self.discount_max[i])))
                self._check_band_reachable(g, i)
        return tuple(pairs)

    def _check_band_reachable(self, g: int, r: int) -> None:
        low = (1.0 - self.discount_max[r]) * self.price_min[g]
        high = (1.0 - self.discount_min[r]) * self.price_max[g]
        if high < self.price_min[r] or low > self.price_max[r]:
            raise InstanceError(
                f"resources.discount_band: drainable {self.names[r]!r} cannot be priced inside its band "
                f"relative to {self.names[g]!r} within its price bounds"
            )

    @property
    def band_pairs(self) -> tuple[BandPair, ...]:
        return self._band_pairs  # type: ignore[attr-defined]

    @property
    def size(self) -> int:
        return len(self.names)

    @property
    def drainable_mask(self) -> np.ndarray:
        return np.array([cls == DRAINABLE for cls in self.resource_class])

    def index(self, name: str) -> int:
        try:
            return self.names.index(name)
        except ValueError:
            raise InstanceError(f"unknown resource name {name!r}") from None

    def keyed(self, values: np.ndarray) -> dict[str, float]:
        return {name: float(v) for name, v in zip(self.names, np.asarray(values, dtype=np.float64))}
