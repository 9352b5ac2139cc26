"""Row compaction for the follower iteration.

Most tenants settle in the first one or two Newton steps (slack budgets at once), so once at
most three quarters of the rows still need work, those rows are gathered into a compact
population and the iteration continues on it alone. Only the fields the follower kernels read are gathered
(two or three (n, M) arrays per family), into workspace buffers that alternate between two
levels, so nothing is allocated per step."""

from __future__ import annotations

import torch

from market_pipeline.market.population import DevicePopulation
from market_pipeline.market.utility import ISOELASTIC, LOG, FamilyBlock

MIN_ROWS = 4096  # below this the gathers cost more than the rows they save

KERNEL_FIELDS = {
    LOG: ("weight", "neg_saturation"),
    ISOELASTIC: ("choke", "saturation", "neg_saturation"),
}
QUADRATIC_FIELDS = ("saturation", "slope", "neg_slope")


def compact(pop: DevicePopulation, keep: torch.Tensor, level: int) -> DevicePopulation:
    """The rows ``keep`` (sorted) of ``pop`` as a population whose blocks carry only the
    fields of the follower kernels (other block fields are None)."""
    ws = pop.workspace
    count = int(keep.numel())
    bounds = torch.searchsorted(
        keep, torch.tensor([b.start for b in pop.blocks] + [pop.size], device=keep.device)
    ).tolist()
    blocks = []
    for block, lo, hi in zip(pop.blocks, bounds[:-1], bounds[1:]):
        local = keep[lo:hi] - block.start
        gathered = {}
        for field in KERNEL_FIELDS.get(block.family, QUADRATIC_FIELDS):
            out = ws.take(f"compact{level}_{field}", count)[lo:hi]
            gathered[field] = torch.index_select(getattr(block, field), 0, local, out=out)
        blocks.append(
            FamilyBlock(
                block.family,
                lo,
                hi,
                gathered.get("weight"),
                gathered.get("saturation"),
                gathered.get("neg_saturation"),
                gathered.get("choke"),
                None if block.eta is None else block.eta[local],
                gathered.get("slope"),
                gathered.get("neg_slope"),
            )
        )
    delay = None
    if pop.delay_cost is not None:
        if pop.delay_cost.shape[1] == 1:
            delay = pop.delay_cost[keep]
        else:
            delay = torch.index_select(pop.delay_cost, 0, keep, out=ws.take(f"compact{level}_delay", count))
    return DevicePopulation(
        pop.device, tuple(blocks), pop.budget[keep], None, delay, None, pop.newton_exponent[keep], ws
    )


def level_buffers(pop: DevicePopulation, level: int, count: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(effective price, demand) buffers of a compact level."""
    return pop.workspace.take(f"compact{level}_y", count), pop.workspace.take(f"compact{level}_d", count)
