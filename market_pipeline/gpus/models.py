"""Physical GPU model facts the twin needs beyond the market config: power envelope,
NVLink topology and MIG geometry.

The config's `gpu_models` table wins for memory, NVLink and MIG profiles; the shipped
catalog (`defaults/gpu_catalog.toml`, by name or alias) fills what the config does not carry
(TDP, idle power, NVLink domain size) and covers models that only appear in real node lists
(openb: P100, T4, V100M16/32, G1-G3; the spot trace: A100-SXM4-80GB, A800-SXM4-80GB, H800,
GPU-series-N).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cached_property

from market_pipeline.gpus.catalog import load_gpu_catalog

MIG_SLICES = 7  # compute slices of an A100/H100-class GPU
# Valid first slice of each MIG profile size on the A100/H100 geometry (NVIDIA MIG user
# guide, "A100 MIG profiles"): an instance must start at one of these slices.
MIG_STARTS: dict[int, tuple[int, ...]] = {
    1: (0, 1, 2, 3, 4, 5, 6),
    2: (0, 2, 4),
    3: (0, 4),
    4: (0,),
    7: (0,),
}
_MIG_PROFILE = re.compile(r"^(\d)g\.\d+gb$")


class GpuModelError(ValueError):
    """A GPU model or MIG profile cannot be interpreted; the message names it."""


@dataclass(frozen=True)
class GpuModelSpec:
    name: str
    memory_mib: int
    tdp_w: float
    idle_w: float
    nvlink: bool = False
    nvlink_domain: int = 8  # GPUs sharing one NVLink/NVSwitch domain
    mig_profiles: tuple[str, ...] = ()

    @cached_property
    def mig_slice_sizes(self) -> tuple[int, ...]:
        return tuple(sorted({mig_profile_slices(p) for p in self.mig_profiles}))

    @property
    def mig_capable(self) -> bool:
        return bool(self.mig_profiles)


# A model the shipped catalog does not name (memory MiB, TDP W, idle W, nvlink, NVLink domain
# size): a mid-range datacentre card's envelope.
_DEFAULT_ENVELOPE = (32768, 300.0, 35.0, False, 1)


def _envelope(name: str) -> tuple[int, float, float, bool, int]:
    """The board facts of `name` (or one of its aliases) from the shipped catalog."""
    entry = load_gpu_catalog().lookup(name)
    if entry is None:
        return _DEFAULT_ENVELOPE
    return entry.memory_mib, entry.tdp_w, entry.idle_w, entry.nvlink, entry.nvlink_domain


def _domain_size(nvlink: bool, known_domain: int) -> int:
    # A configured NVLink model we know nothing about is taken as one NVSwitch domain of 8.
    if not nvlink:
        return 1
    return known_domain if known_domain > 1 else 8


def mig_profile_slices(profile: str) -> int:
    """Compute slices of a MIG profile name such as '3g.40gb'."""
    match = _MIG_PROFILE.match(profile.strip().lower())
    if not match or int(match.group(1)) not in MIG_STARTS:
        raise GpuModelError(f"MIG profile {profile!r}: expected '<n>g.<m>gb' with n in {sorted(MIG_STARTS)}")
    return int(match.group(1))


def mig_profile_for_slices(spec: GpuModelSpec, slices: int) -> str:
    """The configured profile name of an instance with `slices` compute slices."""
    for profile in spec.mig_profiles:
        if mig_profile_slices(profile) == slices:
            return profile
    return f"{slices}g"


def known_spec(name: str) -> GpuModelSpec:
    """Facts for a model that is not in the config (node lists)."""
    memory, tdp, idle, nvlink, domain = _envelope(name)
    return GpuModelSpec(name, memory, tdp, idle, nvlink, _domain_size(nvlink, domain))


def spec_from_config(
    name: str, memory_mib: int, nvlink: bool, mig_profiles: list[str] | tuple[str, ...]
) -> GpuModelSpec:
    """A configured model, its power envelope and NVLink domain from the known table."""
    for profile in mig_profiles:
        mig_profile_slices(profile)  # validate early, naming the bad profile
    _, tdp, idle, _, domain = _envelope(name)
    return GpuModelSpec(
        name=name,
        memory_mib=memory_mib,
        tdp_w=tdp,
        idle_w=idle,
        nvlink=nvlink,
        nvlink_domain=_domain_size(nvlink, domain),
        mig_profiles=tuple(mig_profiles),
    )
