"""The tenant population (followers) as tensors, rows grouped by utility family.

Shapes: N tenants x M resources. Tenants are stored sorted by family (stable), so that each
family is a contiguous row block and the follower kernels work on views; ``ids`` follows that
order. ``multiplicity`` (default 1) lets one row stand for several identical tenants — used to
aggregate duplicates and by the solver's subsampled warm start.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from market_pipeline.market.errors import InstanceError
from market_pipeline.market.utility import FAMILIES, ISOELASTIC, QUADRATIC, FamilyBlock
from market_pipeline.market.workspace import Workspace

DTYPE = torch.float64


@dataclass(frozen=True, eq=False)
class DevicePopulation:
    """The population's tensors on one device, with per-family blocks and derived constants."""

    device: torch.device
    blocks: tuple[FamilyBlock, ...]
    budget: torch.Tensor  # (N,), inf = no budget constraint
    multiplicity: torch.Tensor | None  # (N,) or None for all ones
    delay_cost: torch.Tensor | None  # (N, 1) when per tenant, (N, M) when per resource, None if all 0
    entry_price: torch.Tensor  # (N, M) U'(0) - delay: the resource enters the basket below it
    newton_exponent: torch.Tensor  # (N,) eta for log (1) / isoelastic rows, 0 for quadratic rows
    workspace: Workspace

    @property
    def size(self) -> int:
        return int(self.budget.shape[0])

    def buffer(self, name: str, dtype: torch.dtype | None = None) -> torch.Tensor:
        """A scratch (N, M) buffer of this population's workspace."""
        return self.workspace.take(name, self.size, dtype)

    def slot(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The (effective price, demand) buffers of follower slot ``index``."""
        return self.workspace.slot(index, self.size)

    def using(self, workspace: Workspace) -> "DevicePopulation":
        return dataclasses.replace(self, workspace=workspace)

    def aggregate(self, per_tenant: torch.Tensor) -> torch.Tensor:
        """Sum rows (N, ...) weighted by multiplicity."""
        if self.multiplicity is None:
            return per_tenant.sum(dim=0)
        return self.multiplicity @ per_tenant


@dataclass(frozen=True, eq=False)
class TenantPopulation:
    ids: tuple[str, ...]
    family_spans: tuple[tuple[str, int, int], ...]
    weight: torch.Tensor  # (N, M)
    saturation: torch.Tensor  # (N, M)
    budget: torch.Tensor  # (N,)
    eta: torch.Tensor  # (N,), isoelastic curvature (1 elsewhere)
    delay_cost: torch.Tensor | None  # (N, M)
    multiplicity: torch.Tensor | None  # (N,)
    drain_tolerant: torch.Tensor  # (N,) bool
    _device_cache: dict = field(default_factory=dict, repr=False)  # device copies and subsamples

    @staticmethod
    def build(
        *,
        ids: Sequence[str],
        families: Sequence[str],
        weight: np.ndarray | torch.Tensor,
        saturation: np.ndarray | torch.Tensor,
        budget: np.ndarray | torch.Tensor,
        drainable_mask: np.ndarray,
        eta: np.ndarray | torch.Tensor | None = None,
        delay_cost: np.ndarray | torch.Tensor | None = None,
        multiplicity: np.ndarray | torch.Tensor | None = None,
        drain_tolerant: np.ndarray | torch.Tensor | None = None,
    ) -> "TenantPopulation":
        """Validate, zero the drainable weights of tenants that are not drain tolerant, and
        sort rows by family."""
        n = len(ids)
        w, s = _matrix("weight", weight, n), _matrix("saturation", saturation, n)
        m = w.shape[1]
        if s.shape != w.shape:
            raise InstanceError(
                f"tenants.saturation: shape {tuple(s.shape)} differs from weight {tuple(w.shape)}"
            )
        if len(drainable_mask) != m:
            raise InstanceError(
                f"tenants.weight: {m} resources per tenant, but the instance has {len(drainable_mask)}"
            )
        b = _vector("budget", budget, n)
        eta_t = torch.ones(n, dtype=DTYPE) if eta is None else _vector("eta", eta, n)
        delay = None if delay_cost is None else _matrix("delay_cost", delay_cost, n).expand(n, m).contiguous()
        mult = None if multiplicity is None else _vector("multiplicity", multiplicity, n)
        tolerant = (
            torch.ones(n, dtype=torch.bool)
            if drain_tolerant is None
            else torch.as_tensor(np.asarray(drain_tolerant, dtype=bool))
        )
        _validate(ids, families, w, s, b, eta_t, delay, mult)
        if len(tolerant) != n:
            raise InstanceError(f"tenants.drain_tolerant: expected {n} values")
        drainable = torch.as_tensor(np.asarray(drainable_mask, dtype=bool))
        # Tenants that are not drain tolerant may not buy the drainable class at all.
        w = w.masked_fill((~tolerant).unsqueeze(1) & drainable.unsqueeze(0), 0.0)
        order = np.argsort(np.array([FAMILIES.index(f) for f in families]), kind="stable")
        idx = torch.as_tensor(order)
        sorted_families = [families[i] for i in order]
        spans = []
        for family in FAMILIES:
            rows = [i for i, f in enumerate(sorted_families) if f == family]
            if rows:
                spans.append((family, rows[0], rows[-1] + 1))
        return TenantPopulation(
            ids=tuple(str(ids[i]) for i in order),
            family_spans=tuple(spans),
            weight=w[idx].contiguous(),
            saturation=s[idx].contiguous(),
            budget=b[idx].contiguous(),
            eta=eta_t[idx].contiguous(),
            delay_cost=None if delay is None else delay[idx].contiguous(),
            multiplicity=None if mult is None else mult[idx].contiguous(),
            drain_tolerant=tolerant[idx].contiguous(),
        )

    @property
    def size(self) -> int:
        return len(self.ids)

    @property
    def num_resources(self) -> int:
        return int(self.weight.shape[1])

    @property
    def families(self) -> tuple[str, ...]:
        out: list[str] = []
        for family, start, stop in self.family_spans:
            out.extend([family] * (stop - start))
        return tuple(out)

    def on(self, device: str | torch.device) -> DevicePopulation:
        """Tensors on ``device`` (cached per device)."""
        dev = torch.device(device)
        key = str(dev)
        if key not in self._device_cache:
            self._device_cache[key] = self._to_device(dev)
        return self._device_cache[key]

    def _to_device(self, dev: torch.device) -> DevicePopulation:
        w, s, eta = self.weight.to(dev), self.saturation.to(dev), self.eta.to(dev)
        blocks = tuple(FamilyBlock.build(f, a, b, w, s, eta) for f, a, b in self.family_spans)
        delay = None
        if self.delay_cost is not None and bool((self.delay_cost != 0).any()):
            per_tenant = bool((self.delay_cost == self.delay_cost[:, :1]).all())
            delay = (self.delay_cost[:, :1].contiguous() if per_tenant else self.delay_cost).to(dev)
        mult = None
        if self.multiplicity is not None and not bool((self.multiplicity == 1).all()):
            mult = self.multiplicity.to(dev)
        entry = torch.cat([block.choke for block in blocks]) if len(blocks) > 1 else blocks[0].choke.clone()
        if delay is not None:
            entry = entry - delay
        exponent = torch.where(self._family_codes().to(dev) == FAMILIES.index(QUADRATIC), 0.0, eta)
        return DevicePopulation(
            dev, blocks, self.budget.to(dev), mult, delay, entry, exponent, Workspace(self.num_resources, dev)
        )

    def _family_codes(self) -> torch.Tensor:
        codes = torch.empty(self.size, dtype=torch.int64)
        for family, start, stop in self.family_spans:
            codes[start:stop] = FAMILIES.index(family)
        return codes

    def take(self, rows: torch.Tensor, multiplicity_factor: float = 1.0) -> "TenantPopulation":
        """A sub-population (rows in ascending order keep the family grouping)."""
        rows = torch.sort(rows).values
        mult = torch.ones(self.size, dtype=DTYPE) if self.multiplicity is None else self.multiplicity
        families = self.families
        picked_families = [families[i] for i in rows.tolist()]
        spans = []
        for family in FAMILIES:
            hits = [i for i, f in enumerate(picked_families) if f == family]
            if hits:
                spans.append((family, hits[0], hits[-1] + 1))
        return TenantPopulation(
            ids=tuple(self.ids[i] for i in rows.tolist()),
            family_spans=tuple(spans),
            weight=self.weight[rows].contiguous(),
            saturation=self.saturation[rows].contiguous(),
            budget=self.budget[rows].contiguous(),
            eta=self.eta[rows].contiguous(),
            delay_cost=None if self.delay_cost is None else self.delay_cost[rows].contiguous(),
            multiplicity=(mult[rows] * multiplicity_factor).contiguous(),
            drain_tolerant=self.drain_tolerant[rows].contiguous(),
        )

    def subsample(self, count: int, seed: int = 0) -> "TenantPopulation":
        """``count`` random rows standing in for the whole population (multiplicity scaled);
        cached per (count, seed), as the population is immutable."""
        key = ("subsample", count, seed)
        if key not in self._device_cache:
            generator = torch.Generator().manual_seed(seed)
            rows = torch.randperm(self.size, generator=generator)[:count]
            self._device_cache[key] = self.take(rows, multiplicity_factor=self.size / count)
        return self._device_cache[key]

    def with_demand_scale(self, scale: np.ndarray) -> "TenantPopulation":
        """Stretch every tenant's appetite for resource r by scale[r]: U_jr(d) -> k U_jr(d / k).

        At any fixed budget multiplier the demand for r is multiplied exactly by k_r (for all
        three families: saturation scales by k; weight too for log/isoelastic). Budgets scale by
        the tenant's weight-share-weighted average of k, so a uniform scale k multiplies the
        whole best response, spend included, by exactly k."""
        k = torch.as_tensor(np.asarray(scale, dtype=np.float64))
        if k.shape != (self.num_resources,) or not bool(torch.isfinite(k).all()) or bool((k <= 0).any()):
            raise InstanceError(
                f"demand scale: expected {self.num_resources} finite values > 0, got {scale!r}"
            )
        weight_scale = torch.ones_like(self.weight)
        for family, start, stop in self.family_spans:
            if family != QUADRATIC:
                weight_scale[start:stop] = k
        w = self.weight * weight_scale
        total = self.weight.sum(dim=1)
        share = torch.where(total > 0, (self.weight @ k) / total.clamp_min(1e-300), torch.ones_like(total))
        return TenantPopulation(
            ids=self.ids,
            family_spans=self.family_spans,
            weight=w,
            saturation=self.saturation * k,
            budget=self.budget * share,
            eta=self.eta,
            delay_cost=self.delay_cost,
            multiplicity=self.multiplicity,
            drain_tolerant=self.drain_tolerant,
        )


def _matrix(name: str, values: np.ndarray | torch.Tensor, n: int) -> torch.Tensor:
    t = torch.as_tensor(
        np.asarray(values, dtype=np.float64) if not isinstance(values, torch.Tensor) else values
    )
    t = t.to(DTYPE)
    if t.dim() == 1 and t.shape[0] == n:
        t = t.unsqueeze(1)
    if t.dim() != 2 or t.shape[0] != n:
        raise InstanceError(f"tenants.{name}: expected a ({n}, M) matrix, got shape {tuple(t.shape)}")
    return t


def _vector(name: str, values: np.ndarray | torch.Tensor, n: int) -> torch.Tensor:
    t = torch.as_tensor(
        np.asarray(values, dtype=np.float64) if not isinstance(values, torch.Tensor) else values
    )
    t = t.to(DTYPE).reshape(-1)
    if t.shape != (n,):
        raise InstanceError(f"tenants.{name}: expected {n} values, got shape {tuple(t.shape)}")
    return t


def _first_bad(name: str, ids: Sequence[str], bad_rows: torch.Tensor, rule: str) -> None:
    if bool(bad_rows.any()):
        row = int(torch.nonzero(bad_rows)[0])
        raise InstanceError(f"tenants.{name}: must be {rule} (tenant {ids[row]!r})")


def _validate(ids, families, w, s, b, eta, delay, mult) -> None:
    n = len(ids)
    if n == 0:
        raise InstanceError("tenants: at least one tenant is required")
    if len(families) != n:
        raise InstanceError(f"tenants.utility: expected {n} values")
    for i, family in enumerate(families):
        if family not in FAMILIES:
            raise InstanceError(f"tenants.utility: {family!r} (tenant {ids[i]!r}) is not one of {FAMILIES}")
    _first_bad("weight", ids, (~torch.isfinite(w) | (w < 0)).any(dim=1), "finite and >= 0")
    _first_bad("saturation", ids, (~torch.isfinite(s) | (s <= 0)).any(dim=1), "finite and > 0")
    _first_bad("budget", ids, torch.isnan(b) | (b <= 0), "> 0 (null = no budget)")
    iso = torch.tensor([f == ISOELASTIC for f in families])
    _first_bad("eta", ids, iso & (~torch.isfinite(eta) | (eta <= 0)), "finite and > 0 for isoelastic tenants")
    if delay is not None:
        _first_bad("delay_cost", ids, (~torch.isfinite(delay) | (delay < 0)).any(dim=1), "finite and >= 0")
    if mult is not None:
        _first_bad("multiplicity", ids, ~torch.isfinite(mult) | (mult <= 0), "finite and > 0")
