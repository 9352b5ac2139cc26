"""From what the driver calls a GPU and a host's zone to the configured model and pool, and
what share of a GPU a MIG profile holds.

NVML and dcgm-exporter report product names ("NVIDIA A100-SXM4-80GB", "NVIDIA H800"); the
market prices configured models ("A100-80GB") in pools "<model>@<zone>". A real node is
priced only if its GPUs resolve to a configured model, so the rule is explicit and testable:

1. a configured model lists the product name in ``device_names`` (case-insensitive) -> it;
2. else the configured model whose name's tokens (split at '-', '_', ' ') all occur in the
   product name's tokens, the most specific (most tokens) winning, ties refused;
3. else the shipped GPU catalog's model that lists the product name among its aliases
   ("NVIDIA H200" -> "H200"), so the pool reads as a catalog model the config can add;
4. else the product name as reported, which no configured pool prices (inventory reports it).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from market_pipeline.config import MarketPipelineConfig

_SPLIT = re.compile(r"[^A-Z0-9]+")


def _tokens(name: str) -> frozenset[str]:
    return frozenset(t for t in _SPLIT.split(name.upper()) if t and t != "NVIDIA")


@dataclass(frozen=True)
class ModelAlias:
    name: str
    device_names: Sequence[str] = ()


class DeviceModelNamer:
    """Maps product names to configured model names (cached per product name)."""

    def __init__(
        self, models: Iterable[ModelAlias], fallback: Callable[[str], str | None] | None = None
    ) -> None:
        self._models = tuple(models)
        self._fallback = fallback
        self._exact = {d.upper(): m.name for m in self._models for d in m.device_names}
        self._exact.update({m.name.upper(): m.name for m in self._models})
        self._cache: dict[str, str] = {}

    def __call__(self, device_name: str) -> str:
        if device_name not in self._cache:
            self._cache[device_name] = self._resolve(device_name)
        return self._cache[device_name]

    def _resolve(self, device_name: str) -> str:
        exact = self._exact.get(device_name.strip().upper())
        if exact is not None:
            return exact
        have = _tokens(device_name)
        matches = [
            (len(_tokens(m.name)), m.name)
            for m in self._models
            if _tokens(m.name) and _tokens(m.name) <= have
        ]
        if not matches:
            return self._fallback_name(device_name)
        matches.sort(reverse=True)
        if len(matches) > 1 and matches[0][0] == matches[1][0]:
            return device_name  # ambiguous: refuse to guess which price applies
        return matches[0][1]

    def _fallback_name(self, device_name: str) -> str:
        named = self._fallback(device_name) if self._fallback is not None else None
        return named or device_name

    @classmethod
    def from_config(cls, config: MarketPipelineConfig) -> "DeviceModelNamer":
        from market_pipeline.gpus.catalog import catalog_model_name

        return cls(
            (ModelAlias(m.name, tuple(m.device_names)) for m in getattr(config, "gpu_models", ())),
            fallback=catalog_model_name,
        )


def identity_namer(device_name: str) -> str:
    return device_name


def pool_id(model: str, zone: str) -> str:
    return f"{model}@{zone}"


MIG_COMPUTE_SLICES = 7  # A100/H100/H200-class GPUs


def mig_gpu_milli(mig_profile: str | None) -> int:
    """A MIG profile "<n>g.<mem>gb" holds n of the GPU's 7 compute slices; whole GPU = 1000."""
    if not mig_profile:
        return 1000
    head = mig_profile.split("g.", 1)[0]
    return int(1000 * int(head) / MIG_COMPUTE_SLICES) if head.isdigit() else 1000
