"""This machine's NVIDIA GPUs for the `local-process` backend, when NVML can see any."""

from __future__ import annotations


def nvml_gpus() -> list[tuple[str, int]]:
    """(uuid, memory MiB) of this machine's NVIDIA GPUs; empty without driver or package."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # no package, no driver, no device: the backend uses virtual slots
        return []
    try:
        gpus = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            memory = pynvml.nvmlDeviceGetMemoryInfo(handle).total // (1024 * 1024)
            gpus.append((str(pynvml.nvmlDeviceGetUUID(handle)), int(memory)))
        return gpus
    finally:
        pynvml.nvmlShutdown()


def nvml_compute_pids() -> dict[str, set[int]] | None:
    """Pids holding a compute context per GPU uuid; None when NVML is unavailable."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:
        return None
    try:
        holders: dict[str, set[int]] = {}
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            procs = pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
            holders[str(pynvml.nvmlDeviceGetUUID(handle))] = {int(p.pid) for p in procs}
        return holders
    finally:
        pynvml.nvmlShutdown()
