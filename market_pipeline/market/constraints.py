"""The leader's linear price constraints: bounds, the per-tick step and the drainable band."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from market_pipeline.market.errors import InstanceError, SolverError
from market_pipeline.market.qp import solve_qp
from market_pipeline.market.resources import ResourceSet


@dataclass(frozen=True, eq=False)
class PriceConstraints:
    """lower <= p <= upper and band_matrix @ p <= 0 (two rows per drainable/guaranteed pair)."""

    lower: np.ndarray
    upper: np.ndarray
    band_matrix: np.ndarray  # (K, M)
    cache: dict = field(default_factory=dict, repr=False, compare=False)  # step-QP layouts

    @staticmethod
    def build(
        resources: ResourceSet,
        last_prices: np.ndarray | None = None,
        max_step: float | np.ndarray | None = None,
    ) -> "PriceConstraints":
        """``max_step`` is relative: |p - last| <= max_step * last per resource (0.25 = 25%
        per tick). Price bounds take precedence: when the step box misses them, the bound
        nearest the last price is used."""
        lower, upper = resources.price_min.copy(), resources.price_max.copy()
        if max_step is not None:
            if last_prices is None:
                raise InstanceError("max_step: needs last_prices (the step is relative to them)")
            last = _check_last(resources, last_prices)
            step = np.broadcast_to(np.asarray(max_step, dtype=np.float64), last.shape)
            if not np.all(np.isfinite(step)) or np.any(step < 0):
                raise InstanceError(f"max_step: must be finite and >= 0, got {max_step!r}")
            lower = np.clip(np.maximum(lower, last * (1.0 - step)), resources.price_min, resources.price_max)
            upper = np.clip(np.minimum(upper, last * (1.0 + step)), resources.price_min, resources.price_max)
            upper = np.maximum(upper, lower)
        rows = []
        for pair in resources.band_pairs:
            row = np.zeros(resources.size)
            row[pair.guaranteed], row[pair.drainable] = 1.0 - pair.discount_max, -1.0
            rows.append(row)  # (1 - dmax) p_g <= p_d
            row = np.zeros(resources.size)
            row[pair.guaranteed], row[pair.drainable] = -(1.0 - pair.discount_min), 1.0
            rows.append(row)  # p_d <= (1 - dmin) p_g
        band = np.array(rows) if rows else np.zeros((0, resources.size))
        return PriceConstraints(lower, upper, band)

    @property
    def size(self) -> int:
        return self.lower.shape[0]

    def violation(self, prices: np.ndarray) -> float:
        box = max(float(np.max(self.lower - prices)), float(np.max(prices - self.upper)), 0.0)
        band = float(np.max(self.band_matrix @ prices)) if self.band_matrix.size else 0.0
        return max(box, band, 0.0)

    def band_pairs(self) -> list[tuple[int, int, float, float]]:
        """(guaranteed, drainable, low factor, high factor) per band pair:
        low * p_guaranteed <= p_drainable <= high * p_guaranteed."""
        return _band_pairs(self.band_matrix)

    def _into_bands(self, prices: np.ndarray) -> np.ndarray:
        """Cheap repair: move each drainable price into its band, then back into its box."""
        p = prices.copy()
        for g, d, low, high in self.band_pairs():
            p[d] = np.clip(np.clip(p[d], low * p[g], high * p[g]), self.lower[d], self.upper[d])
        return p

    def project(self, prices: np.ndarray) -> np.ndarray:
        """Euclidean projection (relative to the price scale) onto the feasible prices."""
        p = np.clip(np.asarray(prices, dtype=np.float64), self.lower, self.upper)
        tiny = 1e-12 * max(1.0, float(np.abs(p).max()))
        if self.violation(p) <= tiny:
            return p
        moved = self._into_bands(p)
        if self.violation(moved) <= tiny:
            return moved
        fixed = self.upper - self.lower <= 1e-15 * np.maximum(1.0, np.abs(self.upper))
        free = ~fixed
        if not free.any():
            raise SolverError("price constraints: the drainable band cannot be met inside the price/step box")
        scale = np.maximum(self.upper - self.lower, 1e-12)[free]
        n = int(free.sum())
        A = self.band_matrix[:, free] * scale
        rhs = -self.band_matrix[:, fixed] @ self.lower[fixed] - self.band_matrix[:, free] @ self.lower[free]
        inert = ~np.any(A != 0, axis=1)  # rows on fixed prices only: feasible or not, nothing to move
        if np.any(rhs[inert] < -1e-12 * max(1.0, float(np.abs(self.upper).max()))):
            raise SolverError("price constraints: the drainable band cannot be met inside the price/step box")
        A, rhs = A[~inert], rhs[~inert]
        G = np.vstack([np.eye(n), -np.eye(n), A])
        h = np.concatenate([np.ones(n), np.zeros(n), rhs])
        target = (p[free] - self.lower[free]) / scale
        try:
            result = solve_qp(np.eye(n), -target, G, h)
        except SolverError as exc:
            raise SolverError(
                f"price constraints: the drainable band cannot be met inside the price/step box ({exc})"
            ) from exc
        out = self.lower.copy()
        out[free] = np.clip(self.lower[free] + result.x * scale, self.lower[free], self.upper[free])
        return out


def _band_pairs(matrix: np.ndarray) -> list[tuple[int, int, float, float]]:
    """(guaranteed, drainable, low factor, high factor) from the two rows of each pair."""
    pairs = []
    for k in range(0, matrix.shape[0], 2):
        g = int(np.flatnonzero(matrix[k] > 0)[0])
        d = int(np.flatnonzero(matrix[k] < 0)[0])
        pairs.append((g, d, float(matrix[k, g]), float(-matrix[k + 1, g])))
    return pairs


def _check_last(resources: ResourceSet, last_prices: np.ndarray) -> np.ndarray:
    last = np.asarray(last_prices, dtype=np.float64).reshape(-1)
    if last.shape != (resources.size,) or not np.all(np.isfinite(last)) or np.any(last <= 0):
        raise InstanceError(f"last_prices: expected {resources.size} finite prices > 0, got {last_prices!r}")
    return last
