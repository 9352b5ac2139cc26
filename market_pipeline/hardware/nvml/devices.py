"""Reading GPUs through NVML (pynvml / nvidia-ml-py): devices, MIG instances, processes,
ECC/XID health and NVLink peers, as plain dataclasses.

Every NVML query goes through `NvmlReader.query`, which turns an NVML error into None (a
field the device does not support, e.g. utilisation of a MIG-enabled GPU) and remembers
which field failed why, so a probe can show it instead of hiding it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

_MIB = 1024 * 1024


@dataclass
class ProcessReading:
    pid: int
    used_mib: float | None


@dataclass
class DeviceReading:
    uuid: str
    index: int  # the physical GPU's index (a MIG instance carries its parent's)
    name: str
    memory_total_mib: float | None
    memory_used_mib: float | None
    sm_util_pct: float | None
    power_w: float | None
    temp_c: float | None
    processes: list[ProcessReading] = field(default_factory=list)
    parent_uuid: str | None = None  # set for a MIG instance
    mig_profile: str | None = None
    gpu_instance_id: int | None = None
    ecc_uncorrected_volatile: int | None = None
    remapped_rows: dict[str, int] | None = None
    nvlink_peers: tuple[str, ...] = ()
    handle: Any = None
    mig_enabled: bool = False


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def mig_profile_of(name: str) -> str | None:
    """NVML names a MIG device "<GPU name> MIG <profile>", e.g. "... MIG 3g.40gb"."""
    marker = " MIG "
    return name.rsplit(marker, 1)[1].strip() if marker in name else None


class NvmlReader:
    """One pass over the devices of an initialised NVML library (`nvml` is the module)."""

    def __init__(self, nvml: Any, gpm_interval_seconds: float = 0.1) -> None:
        self.nvml = nvml
        self.gpm_interval_seconds = gpm_interval_seconds
        self.unsupported: dict[str, str] = {}

    def query(self, label: str, fn_name: str, *args: Any) -> Any:
        fn = getattr(self.nvml, fn_name, None)
        if fn is None:
            self.unsupported[label] = f"{fn_name} not in this pynvml"
            return None
        try:
            return fn(*args)
        except self.nvml.NVMLError as exc:
            self.unsupported[label] = f"{fn_name}: {exc}"
            return None

    # -- devices ---------------------------------------------------------------------------
    def read_devices(self) -> list[DeviceReading]:
        """Physical GPUs then their MIG instances, with NVLink peers resolved."""
        count = self.nvml.nvmlDeviceGetCount()
        gpus = [self._read_gpu(index) for index in range(count)]
        self._resolve_nvlink_peers(gpus)
        instances: list[DeviceReading] = []
        for gpu in gpus:
            if gpu.mig_enabled:
                instances.extend(self._read_mig_instances(gpu))
        self._fill_mig_utilisation(gpus, instances)
        return gpus + instances

    def _read_gpu(self, index: int) -> DeviceReading:
        nvml = self.nvml
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        uuid = _text(nvml.nvmlDeviceGetUUID(handle))
        memory = self.query(f"{uuid}.memory", "nvmlDeviceGetMemoryInfo", handle)
        util = self.query(f"{uuid}.utilization", "nvmlDeviceGetUtilizationRates", handle)
        power_mw = self.query(f"{uuid}.power", "nvmlDeviceGetPowerUsage", handle)
        temp = self.query(
            f"{uuid}.temperature", "nvmlDeviceGetTemperature", handle, nvml.NVML_TEMPERATURE_GPU
        )
        mig_mode = self.query(f"{uuid}.mig_mode", "nvmlDeviceGetMigMode", handle)
        mig_enabled = bool(mig_mode) and mig_mode[0] == nvml.NVML_DEVICE_MIG_ENABLE
        reading = DeviceReading(
            uuid=uuid,
            index=index,
            name=_text(nvml.nvmlDeviceGetName(handle)),
            memory_total_mib=memory.total / _MIB if memory is not None else None,
            memory_used_mib=memory.used / _MIB if memory is not None else None,
            sm_util_pct=float(util.gpu) if util is not None else None,
            power_w=power_mw / 1000.0 if power_mw is not None else None,
            temp_c=float(temp) if temp is not None else None,
            handle=handle,
            mig_enabled=mig_enabled,
        )
        if not mig_enabled:
            reading.processes = self._processes(uuid, handle)
        reading.ecc_uncorrected_volatile = self.query(
            f"{uuid}.ecc",
            "nvmlDeviceGetTotalEccErrors",
            handle,
            nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
            nvml.NVML_VOLATILE_ECC,
        )
        rows = self.query(f"{uuid}.remapped_rows", "nvmlDeviceGetRemappedRows", handle)
        if rows is not None:
            reading.remapped_rows = dict(
                zip(("correctable", "uncorrectable", "pending", "failure"), (int(v) for v in rows))
            )
        return reading

    def _processes(self, uuid: str, handle: Any) -> list[ProcessReading]:
        found = self.query(f"{uuid}.processes", "nvmlDeviceGetComputeRunningProcesses", handle)
        return [
            ProcessReading(int(p.pid), p.usedGpuMemory / _MIB if p.usedGpuMemory else None)
            for p in (found or [])
        ]

    def _read_mig_instances(self, gpu: DeviceReading) -> list[DeviceReading]:
        nvml = self.nvml
        slots = self.query(f"{gpu.uuid}.mig_count", "nvmlDeviceGetMaxMigDeviceCount", gpu.handle)
        instances = []
        for slot in range(slots or 0):
            try:
                handle = nvml.nvmlDeviceGetMigDeviceHandleByIndex(gpu.handle, slot)
            except nvml.NVMLError:
                continue  # an empty slot: no GPU instance there
            uuid = _text(nvml.nvmlDeviceGetUUID(handle))
            name = _text(nvml.nvmlDeviceGetName(handle))
            memory = self.query(f"{uuid}.memory", "nvmlDeviceGetMemoryInfo", handle)
            instances.append(
                DeviceReading(
                    uuid=uuid,
                    index=gpu.index,
                    name=name,
                    memory_total_mib=memory.total / _MIB if memory is not None else None,
                    memory_used_mib=memory.used / _MIB if memory is not None else None,
                    sm_util_pct=None,  # filled from GPM below where the GPU supports it
                    power_w=gpu.power_w,
                    temp_c=gpu.temp_c,  # device-level readings
                    processes=self._processes(uuid, handle),
                    parent_uuid=gpu.uuid,
                    mig_profile=mig_profile_of(name),
                    gpu_instance_id=self.query(f"{uuid}.gpu_instance", "nvmlDeviceGetGpuInstanceId", handle),
                    handle=handle,
                )
            )
        return instances

    def _resolve_nvlink_peers(self, gpus: list[DeviceReading]) -> None:
        nvml = self.nvml
        for gpu in gpus:
            peers = []
            for other in gpus:
                if other is gpu:
                    continue
                status = self.query(
                    f"{gpu.uuid}.p2p_nvlink",
                    "nvmlDeviceGetP2PStatus",
                    gpu.handle,
                    other.handle,
                    nvml.NVML_P2P_CAPS_INDEX_NVLINK,
                )
                if status == nvml.NVML_P2P_STATUS_OK:
                    peers.append(other.uuid)
            gpu.nvlink_peers = tuple(peers)

    # -- MIG utilisation through GPM (Hopper and newer) -------------------------------------
    def _fill_mig_utilisation(self, gpus: list[DeviceReading], instances: list[DeviceReading]) -> None:
        """SM utilisation of each MIG instance from two GPM samples `gpm_interval` apart.

        NVML has no per-instance utilisation counter; GPM does, on GPUs that support it.
        Elsewhere the value stays None and validation quarantines it as missing.
        """
        parents = {gpu.uuid: gpu for gpu in gpus}
        pending = []
        for instance in instances:
            parent = parents[instance.parent_uuid]
            support = self.query(f"{parent.uuid}.gpm", "nvmlGpmQueryDeviceSupport", parent.handle)
            if not support or not getattr(support, "isSupportedDevice", 0):
                continue
            if instance.gpu_instance_id is None:
                continue
            first = self._gpm_sample(parent.handle, instance.gpu_instance_id)
            if first is not None:
                pending.append((instance, parent, first))
        if not pending:
            return
        time.sleep(self.gpm_interval_seconds)
        for instance, parent, first in pending:
            second = self._gpm_sample(parent.handle, instance.gpu_instance_id)
            if second is not None:
                instance.sm_util_pct = self._gpm_sm_util(instance.uuid, first, second)
                self.query("gpm.free", "nvmlGpmSampleFree", second)
            self.query("gpm.free", "nvmlGpmSampleFree", first)

    def _gpm_sample(self, parent_handle: Any, gpu_instance_id: int) -> Any:
        sample = self.query("gpm.alloc", "nvmlGpmSampleAlloc")
        if sample is None:
            return None
        if self.query("gpm.sample", "nvmlGpmMigSampleGet", parent_handle, gpu_instance_id, sample) is None:
            self.query("gpm.free", "nvmlGpmSampleFree", sample)
            return None
        return sample

    def _gpm_sm_util(self, uuid: str, first: Any, second: Any) -> float | None:
        nvml = self.nvml
        request = nvml.c_nvmlGpmMetricsGet_t()
        request.version = nvml.NVML_GPM_METRICS_GET_VERSION
        request.numMetrics = 1
        request.sample1 = first
        request.sample2 = second
        request.metrics[0].metricId = nvml.NVML_GPM_METRIC_SM_UTIL
        if self.query(f"{uuid}.gpm_metrics", "nvmlGpmMetricsGet", request) is None:
            return None
        metric = request.metrics[0]
        return float(metric.value) if metric.nvmlReturn == nvml.NVML_SUCCESS else None


def main_process(device: DeviceReading):
    """The process using most memory on a device: its task labels the sample."""
    if not device.processes:
        return None
    return max(device.processes, key=lambda p: (p.used_mib or 0.0, -p.pid))


def register_xid_events(nvml: Any) -> tuple[Any, str | None]:
    """An NVML event set for critical XID errors on every device: (events, None), or
    (None, why) where the driver cannot deliver them."""
    try:
        events = nvml.nvmlEventSetCreate()
        for index in range(nvml.nvmlDeviceGetCount()):
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            nvml.nvmlDeviceRegisterEvents(handle, nvml.nvmlEventTypeXidCriticalError, events)
    except (nvml.NVMLError, AttributeError) as exc:
        return None, str(exc)
    return events, None


def drain_xid_events(nvml: Any, events: Any) -> dict[str, int] | None:
    """XID events pending on `events`, per GPU UUID (None: events unavailable)."""
    if events is None:
        return None
    counts: dict[str, int] = {}
    while True:
        try:
            event = nvml.nvmlEventSetWait(events, 0)
        except nvml.NVMLError:
            break  # NVML_ERROR_TIMEOUT: no more pending events
        uuid = nvml.nvmlDeviceGetUUID(event.device)
        uuid = uuid.decode() if isinstance(uuid, bytes) else str(uuid)
        counts[uuid] = counts.get(uuid, 0) + 1
    return counts
