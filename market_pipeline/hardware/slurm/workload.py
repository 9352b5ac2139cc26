"""A workload for the local Slurm cluster: jobs shaped like the openb trace, submitted by sbatch.

Shapes come from the openb summary (`fleet.shapes.builtin_shapes`): GPU count (a fractional
GPU asks for one whole GPU: GRES has no fraction), QoS class and lifetime, the lifetime scaled
down by `time_scale` and clipped. BE/Burstable jobs belong to elastic tenants and run in the
drainable partition, checkpointable (`--requeue`); LS/Guaranteed jobs belong to rigid
tenants and run in the guaranteed partition, not requeueable. A tenant is drawn among those
whose claims name a GPU model of the cluster, weighted by its claim. Each job is the shipped
`job.sh`: it traps the warning and checkpoint signals, writes its checkpoint and resumes from
it when requeued.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from market_pipeline.config.model import Tenant
from market_pipeline.fleet.shapes import QOS_VALUES, builtin_shapes
from market_pipeline.hardware.slurm.client import SlurmClient
from market_pipeline.hardware.slurm.cluster import DRAINABLE_PARTITION, GUARANTEED_PARTITION

JOB_SCRIPT = Path(__file__).with_name("job.sh")
ELASTIC = frozenset({"BE", "Burstable"})


@dataclass(frozen=True)
class GpuKind:
    gres_type: str
    model: str
    gpus_per_node: int


@dataclass(frozen=True)
class JobSpec:
    tenant: str
    gres_type: str
    gpus: int
    seconds: int
    drainable: bool
    kind: str = "training"

    def sbatch_args(self, workdir: Path) -> list[str]:
        partition = DRAINABLE_PARTITION if self.drainable else GUARANTEED_PARTITION
        env = f"ALL,MP_DURATION={self.seconds},MP_CKPT_DIR={workdir},MP_KIND={self.kind}"
        env += f",MP_CHECKPOINT={1 if self.drainable else 0}"
        args = [
            f"--chdir={workdir}",
            f"--job-name=mp-{self.kind}",
            f"--account={self.tenant}",
            f"--partition={partition}",
            f"--gres=gpu:{self.gres_type}:{self.gpus}",
            "--nodes=1",
            "--ntasks=1",
            f"--output={workdir}/%j.out",
            f"--export={env}",
        ]
        if self.drainable:
            args += ["--requeue", f"--comment=kind={self.kind}"]
        else:
            args += ["--no-requeue", f"--comment=kind={self.kind}"]
        return [*args, str(JOB_SCRIPT)]


def workload_specs(
    tenants: Sequence[Tenant],
    kinds: Sequence[GpuKind],
    count: int,
    *,
    seed: int = 7,
    time_scale: float = 200.0,
    min_seconds: int = 5,
    max_seconds: int = 60,
) -> list[JobSpec]:
    """`count` job specs drawn from the openb shapes (deterministic for a seed)."""
    rng = np.random.default_rng([seed, 41])
    shapes = builtin_shapes(rng, size=max(count, 1))
    by_model = {k.model: k for k in kinds}
    specs = []
    for row in range(count):
        qos = QOS_VALUES[int(shapes.qos[row])]
        elastic = qos in ELASTIC
        pool = [t for t in tenants if (t.kind == "elastic") == elastic and set(t.claims) & set(by_model)]
        if not pool:
            pool = [t for t in tenants if set(t.claims) & set(by_model)]
        if not pool:
            raise ValueError("no configured tenant claims a GPU model of the cluster")
        weights = np.array(
            [sum(c.weight * c.saturation for c in t.claims.values()) for t in pool], dtype=float
        )
        tenant = pool[int(rng.choice(len(pool), p=weights / weights.sum()))]
        models = sorted(set(tenant.claims) & set(by_model))
        kind = by_model[models[int(rng.integers(len(models)))]]
        gpus = int(min(max(int(shapes.num_gpu[row]), 1), kind.gpus_per_node))
        seconds = int(np.clip(round(float(shapes.lifetime_s[row]) / time_scale), min_seconds, max_seconds))
        specs.append(
            JobSpec(tenant.id, kind.gres_type, gpus, seconds, elastic and tenant.drain_tolerant, "training")
        )
    return specs


def submit(client: SlurmClient, specs: Sequence[JobSpec], workdir: Path) -> list[str]:
    """sbatch each spec; returns the job ids."""
    workdir.mkdir(parents=True, exist_ok=True)
    return [client.submit(spec.sbatch_args(workdir)) for spec in specs]


def cluster_kinds(nodes: Sequence[tuple[str, int]], namer: Callable[[str], str]) -> list[GpuKind]:
    """(gres type, GPUs per node) of the cluster's nodes -> the GPU kinds jobs may ask for."""
    most: dict[str, int] = {}
    for gres_type, gpus in nodes:
        most[gres_type] = max(most.get(gres_type, 0), gpus)
    return [GpuKind(t, namer(t), n) for t, n in sorted(most.items())]
