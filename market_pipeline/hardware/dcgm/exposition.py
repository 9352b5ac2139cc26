"""dcgm-exporter's Prometheus text exposition, parsed into per-GPU (and per-MIG) readings.

Parsing uses prometheus-client's text parser. One *entity* is a GPU, or a MIG GPU instance
(labels GPU_I_ID / GPU_I_PROFILE), on one host. dcgm-exporter reports a MIG instance under
its parent GPU's UUID, so an instance is keyed "<parent UUID>/<GPU_I_ID>"; device-level
fields the instance lacks (temperature, power) are taken from its parent GPU. On a GPU with
MIG instances only the instances become samples (the parent would count them twice).

Field mapping to the canonical sample schema:
  sm_util_pct   DCGM_FI_DEV_GPU_UTIL, else 100 x DCGM_FI_PROF_GR_ENGINE_ACTIVE (MIG instances)
  mem_used_mib  DCGM_FI_DEV_FB_USED
  mem_total_mib FB_USED + FB_FREE (+ DCGM_FI_DEV_FB_RESERVED when exported)
  power_w       DCGM_FI_DEV_POWER_USAGE        temp_c  DCGM_FI_DEV_GPU_TEMP
  task_id       "<namespace>/<pod>" (labels)   tenant_id  namespace
  xid_errors    null: DCGM_FI_DEV_XID_ERRORS holds the *last* XID code, not a count
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import polars as pl

from market_pipeline.bounded_input import read_text_bounded
from market_pipeline.hardware.protocol import SAMPLE_SCHEMA

GPU_UTIL = "DCGM_FI_DEV_GPU_UTIL"
FB_USED = "DCGM_FI_DEV_FB_USED"
FB_FREE = "DCGM_FI_DEV_FB_FREE"
FB_RESERVED = "DCGM_FI_DEV_FB_RESERVED"
POWER = "DCGM_FI_DEV_POWER_USAGE"
TEMP = "DCGM_FI_DEV_GPU_TEMP"
GR_ENGINE_ACTIVE = "DCGM_FI_PROF_GR_ENGINE_ACTIVE"
XID = "DCGM_FI_DEV_XID_ERRORS"
NVLINK_BANDWIDTH = "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL"
INHERITED_FROM_PARENT = (POWER, TEMP, XID)


class ExpositionError(ValueError):
    """Text that is not a valid Prometheus exposition, or lacks dcgm-exporter labels."""


@dataclass
class GpuEntity:
    hostname: str
    gpu_index: int
    parent_uuid: str
    model: str
    instance_id: str | None = None  # GPU_I_ID: set for a MIG GPU instance
    mig_profile: str | None = None
    fields: dict[str, float] = field(default_factory=dict)
    pods: set[tuple[str, str]] = field(default_factory=set)  # (namespace, pod)
    timestamp: datetime | None = None  # from the exposition, when it carries one

    @property
    def uuid(self) -> str:
        if self.instance_id is None:
            return self.parent_uuid
        return f"{self.parent_uuid}/{self.instance_id}"

    @property
    def key(self) -> tuple[str, str, str | None]:
        return (self.hostname, self.parent_uuid, self.instance_id)

    def sm_util_pct(self) -> float | None:
        if GPU_UTIL in self.fields:
            return self.fields[GPU_UTIL]
        if GR_ENGINE_ACTIVE in self.fields:
            return 100.0 * self.fields[GR_ENGINE_ACTIVE]
        return None

    def mem_total_mib(self) -> float | None:
        if FB_USED not in self.fields or FB_FREE not in self.fields:
            return None
        return self.fields[FB_USED] + self.fields[FB_FREE] + self.fields.get(FB_RESERVED, 0.0)

    def task(self) -> tuple[str, str] | None:
        """The first (namespace, pod) by name; a GPU shared by several pods lists all in pods."""
        return min(self.pods) if self.pods else None


@dataclass(frozen=True)
class Scrape:
    entities: tuple[GpuEntity, ...]  # sample-bearing: whole GPUs and MIG instances
    parents: tuple[GpuEntity, ...]  # every physical GPU seen (for the inventory)
    scraped_at: datetime
    source: str


def parse_exposition(text: str, scraped_at: datetime, source: str = "exposition") -> Scrape:
    """Parse dcgm-exporter text; raise ExpositionError naming the source on bad input."""
    from prometheus_client.parser import text_string_to_metric_families

    entities: dict[tuple[str, str, str | None], GpuEntity] = {}
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if not family.name.startswith("DCGM_FI_"):
                    continue
                _add_sample(
                    entities, family.name, sample.labels, float(sample.value), sample.timestamp, source
                )
    except ExpositionError:
        raise
    except (ValueError, TypeError, IndexError) as exc:
        raise ExpositionError(f"{source}: not a valid Prometheus text exposition: {exc}") from exc
    if not entities:
        raise ExpositionError(f"{source}: no DCGM_FI_* samples with gpu/UUID labels found")
    return _assemble(entities.values(), scraped_at, source)


def _add_sample(
    entities: dict, name: str, labels: dict[str, str], value: float, timestamp: float | None, source: str
) -> None:
    missing = [label for label in ("gpu", "UUID") if not labels.get(label)]
    if missing:
        raise ExpositionError(f"{source}: sample {name} lacks label(s) {', '.join(missing)}")
    try:
        gpu_index = int(labels["gpu"])
    except ValueError:
        raise ExpositionError(f"{source}: sample {name} has non-integer gpu={labels['gpu']!r}") from None
    instance = labels.get("GPU_I_ID") or None
    key = (labels.get("Hostname", ""), labels["UUID"], instance)
    entity = entities.get(key)
    if entity is None:
        entity = GpuEntity(
            hostname=key[0],
            gpu_index=gpu_index,
            parent_uuid=key[1],
            model=labels.get("modelName", ""),
            instance_id=instance,
            mig_profile=labels.get("GPU_I_PROFILE") or None,
        )
        entities[key] = entity
    entity.fields.setdefault(name, value)
    if labels.get("pod"):
        entity.pods.add((labels.get("namespace", ""), labels["pod"]))
    if timestamp is not None:
        seen = datetime.fromtimestamp(timestamp, tz=timezone.utc)
        entity.timestamp = max(entity.timestamp, seen) if entity.timestamp else seen


def _assemble(found: Iterable[GpuEntity], scraped_at: datetime, source: str) -> Scrape:
    by_key = {entity.key: entity for entity in found}
    parents: dict[tuple[str, str], GpuEntity] = {}
    instances: list[GpuEntity] = []
    for entity in by_key.values():
        if entity.instance_id is None:
            parents[(entity.hostname, entity.parent_uuid)] = entity
        else:
            instances.append(entity)
    for instance in instances:
        parent = parents.get((instance.hostname, instance.parent_uuid))
        if parent is None:  # only instance series exported: the GPU is known through them
            parent = GpuEntity(instance.hostname, instance.gpu_index, instance.parent_uuid, instance.model)
            parents[(instance.hostname, instance.parent_uuid)] = parent
        for name in INHERITED_FROM_PARENT:
            if name in parent.fields:
                instance.fields.setdefault(name, parent.fields[name])
    mig_parents = {(i.hostname, i.parent_uuid) for i in instances}
    sampled = [p for k, p in parents.items() if k not in mig_parents] + instances
    sampled.sort(key=lambda e: (e.hostname, e.gpu_index, e.instance_id or ""))
    ordered_parents = sorted(parents.values(), key=lambda e: (e.hostname, e.gpu_index))
    return Scrape(tuple(sampled), tuple(ordered_parents), scraped_at, source)


def scrape_samples(scrape: Scrape) -> pl.DataFrame:
    """One sample per GPU / MIG instance in the canonical schema."""
    rows = []
    for entity in scrape.entities:
        task = entity.task()
        rows.append(
            {
                "ts": entity.timestamp or scrape.scraped_at,
                "node_id": entity.hostname,
                "gpu_uuid": entity.uuid,
                "gpu_index": entity.gpu_index,
                "sm_util_pct": entity.sm_util_pct(),
                "mem_used_mib": entity.fields.get(FB_USED),
                "mem_total_mib": entity.mem_total_mib(),
                "power_w": entity.fields.get(POWER),
                "temp_c": entity.fields.get(TEMP),
                "mig_profile": entity.mig_profile,
                "task_id": f"{task[0]}/{task[1]}" if task else None,
                "tenant_id": task[0] if task else None,
                "xid_errors": None,
            }
        )
    return pl.DataFrame(rows, schema=SAMPLE_SCHEMA)


def read_exposition_file(path: str | Path) -> pl.DataFrame:
    """Samples from a saved exposition; the file's modification time is the scrape time."""
    path = Path(path)
    text = read_text_bounded(path, "dcgm exposition file")
    scraped_at = datetime.fromtimestamp(path.stat().st_mtime, tz=timezone.utc)
    return scrape_samples(parse_exposition(text, scraped_at, source=str(path)))
