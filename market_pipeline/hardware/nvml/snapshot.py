"""What the nvml backend sees, as one JSON-ready dict (for `telemetry probe`)."""

from __future__ import annotations

import dataclasses
import enum
from datetime import datetime
from typing import Any, Protocol

import polars as pl

from market_pipeline.hardware.nvml.devices import DeviceReading
from market_pipeline.hardware.nvml.processes import ProcessIdentity
from market_pipeline.hardware.protocol import NodeAdapter, Outcome


class NvmlView(NodeAdapter, Protocol):
    """What the snapshot reads of the nvml backend: the node protocol plus its raw readings.
    Typed here, not against `NvmlAdapter`, so that `adapter` may import this module without a
    cycle."""

    backend: str
    node_id: str
    unsupported: dict[str, str]

    def now(self) -> datetime: ...
    def probe(self) -> Outcome: ...
    def _library(self) -> Any | None: ...
    def _read(self) -> list[DeviceReading] | None: ...
    def _identities(self, devices: list[DeviceReading]) -> dict[int, ProcessIdentity]: ...
    def _take_xid_counts(self) -> dict[str, int] | None: ...
    def _samples(
        self, devices: list[DeviceReading], xids: dict[str, int] | None, now: datetime
    ) -> pl.DataFrame: ...


def json_ready(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: json_ready(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, (list, tuple)):
        return [json_ready(v) for v in value]
    if isinstance(value, dict):
        return {str(k): json_ready(v) for k, v in value.items()}
    return value


def _versions(adapter: NvmlView) -> dict[str, str | None]:
    nvml = adapter._library()
    found: dict[str, str | None] = {"driver": None, "nvml": None}
    if nvml is None:
        return found
    for key, fn in (("driver", "nvmlSystemGetDriverVersion"), ("nvml", "nvmlSystemGetNVMLVersion")):
        try:
            raw = getattr(nvml, fn)()
            found[key] = raw.decode() if isinstance(raw, bytes) else str(raw)
        except Exception as exc:  # an old driver lacking the call: report, don't fail
            found[key] = f"unavailable ({exc})"
    return found


def build_snapshot(adapter: NvmlView) -> dict[str, object]:
    outcome = adapter.probe()
    snapshot: dict[str, object] = {
        "backend": adapter.backend,
        "node_id": adapter.node_id,
        "status": outcome.status.value,
        "detail": outcome.detail,
        "versions": _versions(adapter),
    }
    if not outcome.ok:
        return snapshot
    devices = adapter._read() or []
    now = adapter.now()
    identities = adapter._identities(devices)
    snapshot["gpus"] = [
        {
            "uuid": d.uuid,
            "index": d.index,
            "name": d.name,
            "mig_enabled": d.mig_enabled,
            "memory_total_mib": d.memory_total_mib,
            "memory_used_mib": d.memory_used_mib,
            "sm_util_pct": d.sm_util_pct,
            "power_w": d.power_w,
            "temp_c": d.temp_c,
            "ecc_uncorrected_volatile": d.ecc_uncorrected_volatile,
            "remapped_rows": d.remapped_rows,
            "nvlink_peers": list(d.nvlink_peers),
        }
        for d in devices
        if d.parent_uuid is None
    ]
    snapshot["mig_instances"] = [
        {
            "uuid": d.uuid,
            "parent_uuid": d.parent_uuid,
            "profile": d.mig_profile,
            "gpu_instance_id": d.gpu_instance_id,
            "memory_total_mib": d.memory_total_mib,
            "memory_used_mib": d.memory_used_mib,
            "sm_util_pct": d.sm_util_pct,
        }
        for d in devices
        if d.parent_uuid is not None
    ]
    snapshot["processes"] = [
        {
            "pid": p.pid,
            "gpu_uuid": d.uuid,
            "used_mib": p.used_mib,
            **{k: v for k, v in json_ready(identities[p.pid]).items() if k != "pid"},
        }
        for d in devices
        for p in d.processes
    ]
    snapshot["nodes"] = json_ready(adapter.list_nodes())
    snapshot["tasks"] = json_ready(adapter.list_tasks())
    samples = adapter._samples(devices, adapter._take_xid_counts(), now)
    snapshot["samples"] = json_ready(samples.to_dicts())
    snapshot["unsupported"] = dict(sorted(adapter.unsupported.items()))
    return snapshot
