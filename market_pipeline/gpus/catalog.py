"""The shipped GPU catalog (`defaults/gpu_catalog.toml`): a list price and a cost per GPU-hour
for every GPU model of the shipped traces, each with the rule or source it comes from, and
the model's board facts (memory, NVLink, MIG profiles, power envelope).

The config's `[[gpu_models]]` win for the models they name; the catalog prices the rest of a
real node list (openb's T4, P100, V100, G1-G3; the spot trace's A800 and GPU-series). A
model in neither is `UnpricedModelError`, raised at startup with the config key to add.
"""

from __future__ import annotations

import math
import tomllib
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

CATALOG_PATH = Path(__file__).resolve().parent.parent / "defaults" / "gpu_catalog.toml"


class UnpricedModelError(ValueError):
    """A fleet holds a GPU model that neither the config nor the shipped catalog prices."""


@dataclass(frozen=True)
class CatalogEntry:
    name: str
    aliases: tuple[str, ...]
    list_price_per_gpu_hour: float
    cost_per_gpu_hour: float
    memory_mib: int
    mig_profiles: tuple[str, ...]
    nvlink: bool
    tdp_w: float
    idle_w: float
    source: str
    assumption: str = ""
    nvlink_domain: int = 8  # GPUs sharing one NVLink/NVSwitch domain (when nvlink)

    def __post_init__(self) -> None:
        for name in ("list_price_per_gpu_hour", "cost_per_gpu_hour"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"gpu catalog {self.name}: {name} must be finite and > 0, got {value!r}")
        if not 0 < self.idle_w < self.tdp_w:
            raise ValueError(
                f"gpu catalog {self.name}: needs 0 < idle_w < tdp_w, got {self.idle_w}, {self.tdp_w}"
            )
        if self.nvlink_domain < 1:
            raise ValueError(f"gpu catalog {self.name}: nvlink_domain must be >= 1, got {self.nvlink_domain}")
        if self.cost_per_gpu_hour >= self.list_price_per_gpu_hour:
            raise ValueError(f"gpu catalog {self.name}: cost_per_gpu_hour must be below the list price")


def _key(name: str) -> str:
    """A model name as looked up: case and outer blanks do not matter ("nvidia l4 " = "NVIDIA L4")."""
    return " ".join(name.split()).casefold()


@dataclass(frozen=True)
class GpuCatalog:
    entries: tuple[CatalogEntry, ...]
    _by_key: dict[str, CatalogEntry] = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self) -> None:
        for entry in self.entries:
            for spelling in (entry.name, *entry.aliases):
                other = self._by_key.setdefault(_key(spelling), entry)
                if other is not entry:
                    raise ValueError(f"gpu catalog: {spelling!r} names both {other.name} and {entry.name}")

    def lookup(self, name: str) -> CatalogEntry | None:
        """The entry named `name` or listing it among its aliases (the product names NVML and
        dcgm-exporter report included), ignoring case and outer blanks."""
        return self._by_key.get(_key(name))

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(e.name for e in self.entries)


@lru_cache(maxsize=4)
def load_gpu_catalog(path: Path = CATALOG_PATH) -> GpuCatalog:
    raw = tomllib.loads(path.read_text())
    entries = []
    for item in raw.get("models", []):
        entries.append(
            CatalogEntry(
                name=str(item["name"]),
                aliases=tuple(item.get("aliases", ())),
                list_price_per_gpu_hour=float(item["list_price_per_gpu_hour"]),
                cost_per_gpu_hour=float(item["cost_per_gpu_hour"]),
                memory_mib=int(item["memory_mib"]),
                mig_profiles=tuple(item.get("mig_profiles", ())),
                nvlink=bool(item.get("nvlink", False)),
                tdp_w=float(item["tdp_w"]),
                idle_w=float(item["idle_w"]),
                nvlink_domain=int(item.get("nvlink_domain", 8)),
                source=str(item["source"]),
                assumption=str(item.get("assumption", "")),
            )
        )
    return GpuCatalog(tuple(entries))


def catalog_model_name(name: str) -> str | None:
    """The shipped catalog's model that `name` spells (by name or alias), else None."""
    entry = load_gpu_catalog().lookup(name)
    return entry.name if entry is not None else None


def unpriced_model_message(model: str, fleet_source: str) -> str:
    return (
        f"GPU model {model!r} in fleet {fleet_source} has no price: add a [[gpu_models]] entry "
        f"with name = {model!r}, memory_mib, cost_per_gpu_hour and list_price_per_gpu_hour "
        "to the config (gpu_models), or name it in market_pipeline/defaults/gpu_catalog.toml"
    )
