"""This machine's NVIDIA GPUs for the `local-process` backend, when NVML can see any."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any


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


def free_gpus(
    gpus: Sequence[tuple[str, int]], tasks: Iterable[dict[str, Any]], count: int, gpu_milli: int, node_id: str
) -> list[str]:
    """`count` GPUs with room for `gpu_milli` beside the running tasks' shares (ValueError if not)."""
    if count < 1 or not 0 < gpu_milli <= 1000:
        raise ValueError(f"need gpus >= 1 and 0 < gpu_milli <= 1000, got {count}, {gpu_milli}")
    used = {g: 0 for g, _ in gpus}
    for r in tasks:
        if r["ended_at"] is None:
            for g in r["gpu_uuids"]:
                used[g] = used.get(g, 0) + r["gpu_milli"]
    free = [g for g, _ in gpus if used[g] + gpu_milli <= 1000]
    if len(free) < count:
        raise ValueError(f"no room for {count} GPU(s) x {gpu_milli} milli on {node_id}")
    return free[:count]
