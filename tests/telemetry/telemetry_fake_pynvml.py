"""A fake `pynvml` module for the nvml backend's tests: the same call surface, canned devices.

Only what the backend calls is modelled; an unknown call raises AttributeError like a real
older pynvml would. Values use NVML's units (bytes, milliwatts).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace

NVML_SUCCESS = 0
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_TEMPERATURE_GPU = 0
NVML_DEVICE_MIG_ENABLE = 1
NVML_DEVICE_MIG_DISABLE = 0
NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
NVML_VOLATILE_ECC = 0
NVML_P2P_CAPS_INDEX_NVLINK = 2
NVML_P2P_STATUS_OK = 0
NVML_P2P_STATUS_NOT_SUPPORTED = 5
NVML_GPM_METRICS_GET_VERSION = 1
NVML_GPM_METRIC_SM_UTIL = 2
nvmlEventTypeXidCriticalError = 0x8
GIB = 1024**3


class NVMLError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value

    def __str__(self) -> str:
        return {
            NVML_ERROR_NOT_SUPPORTED: "Not Supported",
            NVML_ERROR_NOT_FOUND: "Not Found",
            NVML_ERROR_TIMEOUT: "Timeout",
            NVML_ERROR_LIBRARY_NOT_FOUND: "NVML Shared Library Not Found",
        }.get(self.value, f"NVML error {self.value}")


@dataclass
class FakeMig:
    uuid: str
    profile: str
    gi_id: int
    mem_total: int
    mem_used: int
    pids: list[tuple[int, int]] = field(default_factory=list)  # (pid, bytes)
    gpm_util: float | None = 37.5


@dataclass
class FakeGpu:
    uuid: str
    name: str = "NVIDIA H200"
    mem_total: int = 141 * GIB
    mem_used: int = 10 * GIB
    util: int = 55
    power_mw: int = 412_000
    temp: int = 48
    pids: list[tuple[int, int]] = field(default_factory=list)
    migs: list[FakeMig] = field(default_factory=list)
    nvlink_group: str | None = "board"
    ecc: int | None = 0
    gpm_supported: bool = True


@dataclass
class _Handle:
    gpu: FakeGpu
    mig: FakeMig | None = None


class FakeNvml:
    """Pass as `NvmlAdapter(nvml=FakeNvml(gpus))`."""

    NVMLError = NVMLError

    def __init__(self, gpus: list[FakeGpu], init_error: int | None = None) -> None:
        self.gpus = gpus
        self.init_error = init_error
        self.init_calls = 0
        self.pending_xids: list[tuple[int, int]] = []  # (gpu index, xid code)
        self.registered = False
        for name, value in globals().items():
            if name.startswith(("NVML_", "nvmlEvent")):
                setattr(self, name, value)

    # lifecycle
    def nvmlInit(self) -> None:
        self.init_calls += 1
        if self.init_error is not None:
            raise NVMLError(self.init_error)

    def nvmlShutdown(self) -> None:
        pass

    def nvmlSystemGetDriverVersion(self) -> str:
        return "560.35.03"

    def nvmlSystemGetNVMLVersion(self) -> str:
        return "12.560.35.03"

    # devices
    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> _Handle:
        return _Handle(self.gpus[index])

    def nvmlDeviceGetUUID(self, handle: _Handle) -> str:
        return handle.mig.uuid if handle.mig else handle.gpu.uuid

    def nvmlDeviceGetName(self, handle: _Handle) -> str:
        if handle.mig:
            return f"{handle.gpu.name} MIG {handle.mig.profile}"
        return handle.gpu.name

    def nvmlDeviceGetMemoryInfo(self, handle: _Handle):
        if handle.mig:
            return SimpleNamespace(total=handle.mig.mem_total, used=handle.mig.mem_used)
        return SimpleNamespace(total=handle.gpu.mem_total, used=handle.gpu.mem_used)

    def nvmlDeviceGetUtilizationRates(self, handle: _Handle):
        if handle.mig or handle.gpu.migs:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return SimpleNamespace(gpu=handle.gpu.util, memory=20)

    def nvmlDeviceGetPowerUsage(self, handle: _Handle) -> int:
        return handle.gpu.power_mw

    def nvmlDeviceGetTemperature(self, handle: _Handle, sensor: int) -> int:
        return handle.gpu.temp

    def nvmlDeviceGetMigMode(self, handle: _Handle):
        mode = NVML_DEVICE_MIG_ENABLE if handle.gpu.migs else NVML_DEVICE_MIG_DISABLE
        return [mode, mode]

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: _Handle) -> int:
        return 7 if handle.gpu.migs else 0

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: _Handle, index: int) -> _Handle:
        if index >= len(handle.gpu.migs):
            raise NVMLError(NVML_ERROR_NOT_FOUND)
        return _Handle(handle.gpu, handle.gpu.migs[index])

    def nvmlDeviceGetGpuInstanceId(self, handle: _Handle) -> int:
        return handle.mig.gi_id

    def nvmlDeviceGetComputeRunningProcesses(self, handle: _Handle):
        pids = handle.mig.pids if handle.mig else handle.gpu.pids
        return [SimpleNamespace(pid=pid, usedGpuMemory=used) for pid, used in pids]

    def nvmlDeviceGetTotalEccErrors(self, handle: _Handle, error_type: int, counter: int) -> int:
        if handle.gpu.ecc is None:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return handle.gpu.ecc

    def nvmlDeviceGetRemappedRows(self, handle: _Handle):
        return (0, 0, 0, 0)

    def nvmlDeviceGetP2PStatus(self, first: _Handle, second: _Handle, index: int) -> int:
        group = first.gpu.nvlink_group
        if group is not None and group == second.gpu.nvlink_group:
            return NVML_P2P_STATUS_OK
        return NVML_P2P_STATUS_NOT_SUPPORTED

    # XID events
    def nvmlEventSetCreate(self) -> str:
        return "event-set"

    def nvmlDeviceRegisterEvents(self, handle: _Handle, types: int, events: str) -> None:
        self.registered = True

    def nvmlEventSetWait(self, events: str, timeout_ms: int):
        if not self.pending_xids:
            raise NVMLError(NVML_ERROR_TIMEOUT)
        index, code = self.pending_xids.pop(0)
        return SimpleNamespace(device=_Handle(self.gpus[index]), eventData=code)

    def nvmlEventSetFree(self, events: str) -> None:
        pass

    # GPM (per-MIG utilisation)
    def nvmlGpmQueryDeviceSupport(self, handle: _Handle):
        return SimpleNamespace(isSupportedDevice=int(handle.gpu.gpm_supported))

    def nvmlGpmSampleAlloc(self):
        return SimpleNamespace(util=None)

    def nvmlGpmSampleFree(self, sample) -> None:
        pass

    def nvmlGpmMigSampleGet(self, handle: _Handle, gi_id: int, sample):
        mig = next(m for m in handle.gpu.migs if m.gi_id == gi_id)
        sample.util = mig.gpm_util
        return sample

    def c_nvmlGpmMetricsGet_t(self):
        return SimpleNamespace(
            version=0,
            numMetrics=0,
            sample1=None,
            sample2=None,
            metrics=[SimpleNamespace(metricId=0, value=0.0, nvmlReturn=-1)],
        )

    def nvmlGpmMetricsGet(self, request):
        util = request.sample2.util
        request.metrics[0].value = util if util is not None else 0.0
        request.metrics[0].nvmlReturn = NVML_SUCCESS if util is not None else NVML_ERROR_NOT_SUPPORTED
        return request


def assert_outcome_ok(outcome) -> None:
    """An adapter call against the fake library succeeded (its status and detail if not)."""
    assert outcome.ok, f"{outcome.status}: {outcome.detail}"
