"""Small generated inputs (no trace files needed): a fleet of identical nodes per GPU model,
a pod list with openb-like shapes, QoS mix and heavy-tailed runtimes, and a diurnal or flat
load. For tests and smoke runs; the numbers they produce say nothing about real workloads."""

from __future__ import annotations

import numpy as np

from market_pipeline.lab.simulate.inputs import FleetNodes, LoadProfile, PodTable

# (num_gpu, gpu_milli, share of pods): openb's most common shapes.
SHAPES = ((1, 1000, 0.45), (1, 500, 0.2), (1, 250, 0.15), (2, 1000, 0.08), (4, 1000, 0.07), (8, 1000, 0.05))
QOS_SHARE = (("LS", 0.55), ("BE", 0.4), ("Burstable", 0.04), ("Guaranteed", 0.01))


def synthetic_fleet(
    nodes_per_model: dict[str, tuple[int, int]], cpu_per_gpu: int = 12000, mem_per_gpu: int = 65536
) -> FleetNodes:
    """`{model: (nodes, gpus_per_node)}`."""
    ids, models, gpus = [], [], []
    for model, (count, per_node) in nodes_per_model.items():
        for i in range(count):
            ids.append(f"{model}-n{i:03d}")
            models.append(model)
            gpus.append(per_node)
    g = np.array(gpus, dtype=np.int64)
    return FleetNodes(tuple(ids), tuple(models), g, g * cpu_per_gpu, g * mem_per_gpu, source="synthetic")


def synthetic_pods(
    count: int, seed: int = 0, max_gpus: int = 8, median_runtime_s: float = 1800.0
) -> PodTable:
    rng = np.random.default_rng(seed)
    shapes = [s for s in SHAPES if s[0] <= max_gpus]
    share = np.array([s[2] for s in shapes])
    pick = rng.choice(len(shapes), size=count, p=share / share.sum())
    num_gpu = np.array([shapes[i][0] for i in pick], dtype=np.int64)
    gpu_milli = np.array([shapes[i][1] for i in pick], dtype=np.int64)
    qos_names = np.array([q for q, _ in QOS_SHARE])
    qos = qos_names[rng.choice(len(QOS_SHARE), size=count, p=[p for _, p in QOS_SHARE])]
    runtime = np.maximum(rng.lognormal(np.log(median_runtime_s), 1.5, count), 1.0)
    cpu = num_gpu * 6000
    return PodTable(
        tuple(f"synthetic-pod-{i:05d}" for i in range(count)),
        num_gpu,
        gpu_milli,
        cpu,
        cpu * 4,
        qos,
        runtime,
        tuple(() for _ in range(count)),
        {"cpu_only": 0, "never_scheduled": 0},
        "synthetic",
    )


def diurnal_load(
    days: int, step_minutes: int = 60, mean_ratio: float = 0.7, swing: float = 0.2, seed: int = 0
) -> LoadProfile:
    """Demand/capacity with a daily cycle (peak mid-afternoon) and a little noise."""
    rng = np.random.default_rng(seed)
    steps = days * 1440 // step_minutes
    hours = np.arange(steps) * step_minutes / 60.0
    ratio = (
        mean_ratio * (1.0 + swing * np.sin(2 * np.pi * (hours - 9.0) / 24.0)) * rng.normal(1.0, 0.03, steps)
    )
    return LoadProfile(np.maximum(ratio, 0.01), step_minutes, f"diurnal(mean={mean_ratio}, swing={swing})")


def flat_load(days: int, step_minutes: int = 60) -> LoadProfile:
    steps = days * 1440 // step_minutes
    return LoadProfile(np.ones(steps), step_minutes, "flat")
