"""The workload model: jobs that replay real shapes (openb pods or the built-in summary),
owned by the configured tenants, arriving under an arrival profile.

Arrival rate per GPU model follows Little's law: busy GPUs = rate x E[GPUs x lifetime], so
rate(t) = target_utilisation x baseline GPUs of the model x profile factor(t) / E[GPUs x
lifetime]. Each job picks its model first (proportional to the fleet), then a shape that fits
it (gpu_spec empty or naming the model, no more GPUs than its nodes hold), then a tenant:
BE/Burstable jobs go to elastic tenants (drainable class when the tenant is drain
tolerant), LS/Guaranteed jobs to rigid tenants (guaranteed class), weighted by the tenant's
claim on that model (weight x saturation), else by budget. All randomness comes from
`numpy.random.default_rng([seed, stream, block])`, so a simulated hour's arrivals do not
depend on how the caller chunks time.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from market_pipeline.config.model import Tenant
from market_pipeline.fleet.arrivals import ArrivalProfile
from market_pipeline.fleet.catalog import FleetCatalog
from market_pipeline.fleet.shapes import QOS_VALUES, JobShapes, WorkloadError
from market_pipeline.hardware.protocol import NodeState
from market_pipeline.placement.capacity import PodRequest

STREAM_BUILTIN, STREAM_ARRIVALS, STREAM_INITIAL, STREAM_NOISE, STREAM_XID = 1, 2, 3, 4, 5
BLOCK_SECONDS = 3600
ELASTIC_QOS = ("BE", "Burstable")
PRIORITY_BY_QOS = {"BE": 0, "Burstable": 1, "LS": 2, "Guaranteed": 3}  # lower drains first
INFERENCE_SHARE_BY_QOS = {"LS": 0.75, "BE": 0.15, "Burstable": 0.10, "Guaranteed": 0.0}
DEFAULT_TENANT = "default-tenant"


@dataclass(frozen=True)
class WorkloadParams:
    target_utilisation: float = 0.65  # mean share of the baseline (initially ON) GPUs asked for
    diurnal_amplitude: float = 0.30
    peak_hour_utc: float = 6.0
    lifetime_cap_s: int = 86_400  # a platform's maximum job duration
    pending_timeout_s: int = 4 * 3_600  # a job that waits longer is abandoned
    idle_task_share: float = 0.05  # tasks that hold GPUs but barely use them
    arrival_source: str = "diurnal"  # or a Helios per-minute CSV
    builtin_size: int = 4_000

    def __post_init__(self) -> None:
        if not 0 < self.target_utilisation <= 2:
            raise WorkloadError(f"target_utilisation must be in (0, 2], got {self.target_utilisation}")
        if not 0 <= self.idle_task_share <= 1:
            raise WorkloadError(f"idle_task_share must be in [0, 1], got {self.idle_task_share}")
        if self.lifetime_cap_s < 60 or self.pending_timeout_s < 0:
            raise WorkloadError("lifetime_cap_s must be >= 60 and pending_timeout_s >= 0")


@dataclass
class Job:
    """One task of the workload, with the traits the twin's behaviour depends on."""

    task_id: str
    tenant_id: str
    gpu_model: str
    num_gpu: int
    gpu_milli: int
    cpu_milli: int
    mem_mib: int
    qos: str
    kind: str  # training | inference
    resource_class: str  # guaranteed | drainable
    priority: int
    do_not_drain: bool
    checkpointable: bool
    lifetime_s: int
    arrival_ts: int  # unix seconds
    util_level: float  # mean SM utilisation (%) on its share when busy
    gpu_mem_share: float  # share of its reserved GPU memory in use
    checkpoint_s: float
    exit_s: float  # seconds to exit after SIGTERM
    ignores_sigterm: bool

    def request(self) -> PodRequest:
        return PodRequest(self.num_gpu, self.gpu_milli, self.cpu_milli, self.mem_mib, (self.gpu_model,))

    def to_json(self) -> dict[str, Any]:
        # every field is a scalar: a flat copy is `asdict`'s answer without its deep copy (the
        # twin's state holds thousands of jobs where guaranteed work waits)
        return {name: getattr(self, name) for name in _JOB_FIELDS}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "Job":
        missing = [name for name in _JOB_FIELDS if name not in data]
        if missing:
            raise WorkloadError(f"stored job {data.get('task_id')!r} lacks fields {sorted(missing)}")
        return cls(**{k: data[k] for k in _JOB_FIELDS})


_JOB_FIELDS = tuple(f.name for f in fields(Job))


def model_slug(model: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in model.lower()).strip("-")


class TenantMix:
    """Who owns a job of a given model and QoS."""

    def __init__(self, tenants: Sequence[Tenant]) -> None:
        self.tenants = list(tenants)
        self.drain_tolerant = {t.id: t.drain_tolerant for t in tenants}
        self.rigid = {t.id: t.kind == "rigid" for t in tenants}
        self._cache: dict[tuple[str, bool], tuple[list[str], np.ndarray]] = {}

    def _choices(self, model: str, elastic: bool) -> tuple[list[str], np.ndarray]:
        key = (model, elastic)
        if key not in self._cache:
            group = [t for t in self.tenants if (t.kind == "elastic") == elastic] or self.tenants
            claimed = [
                (t.id, t.claims[model].weight * t.claims[model].saturation)
                for t in group
                if model in t.claims
            ]
            pairs = claimed or [(t.id, t.budget_per_hour) for t in group] or [(DEFAULT_TENANT, 1.0)]
            weights = np.array([w for _, w in pairs], dtype=float)
            self._cache[key] = ([i for i, _ in pairs], weights / weights.sum())
        return self._cache[key]

    def pick(self, rng: np.random.Generator, model: str, qos: np.ndarray) -> list[str]:
        elastic = np.isin(qos, [QOS_VALUES.index(q) for q in ELASTIC_QOS])
        out: list[str] = [""] * len(qos)
        for flag in (True, False):
            rows = np.flatnonzero(elastic == flag)
            ids, p = self._choices(model, flag)
            for row, choice in zip(rows, rng.choice(len(ids), size=len(rows), p=p)):
                out[row] = ids[choice]
        return out


class WorkloadModel:
    def __init__(
        self,
        shapes: JobShapes,
        catalog: FleetCatalog,
        tenants: Sequence[Tenant],
        params: WorkloadParams,
        profile: ArrivalProfile,
        seed: int,
    ) -> None:
        gpu_shapes = shapes.gpu_jobs()
        if len(gpu_shapes) == 0:
            raise WorkloadError(f"workload {shapes.source} has no GPU jobs")
        capped = np.minimum(gpu_shapes.lifetime_s, params.lifetime_cap_s)
        self.shapes = JobShapes(
            gpu_shapes.num_gpu,
            gpu_shapes.gpu_milli,
            gpu_shapes.cpu_milli,
            gpu_shapes.mem_mib,
            gpu_shapes.qos,
            gpu_shapes.gpu_spec,
            capped,
            gpu_shapes.source,
        )
        self.params, self.profile, self.seed = params, profile, seed
        self.tenants = TenantMix(tenants)
        self.models = sorted({n.gpu_model for n in catalog.nodes if n.gpus > 0})
        self.compatible: dict[str, np.ndarray] = {}
        self.rate_per_second: dict[str, float] = {}
        self.baseline_gpus: dict[str, int] = {}
        for model in self.models:
            nodes = [n for n in catalog.nodes if n.gpu_model == model]
            widest = max(n.gpus for n in nodes)
            spec_ok = np.array([not s or model in str(s).split("|") for s in self.shapes.gpu_spec])
            rows = np.flatnonzero(spec_ok & (self.shapes.num_gpu <= widest))
            self.compatible[model] = rows
            baseline = sum(n.gpus for n in nodes if n.initial_state is NodeState.ON)
            self.baseline_gpus[model] = baseline
            gpu_seconds = (
                float((self.shapes.gpus[rows] * self.shapes.lifetime_s[rows]).mean()) if len(rows) else 0.0
            )
            self.rate_per_second[model] = (
                params.target_utilisation * baseline / gpu_seconds if gpu_seconds > 0 else 0.0
            )

    # -- arrivals ---------------------------------------------------------------------------
    def block_arrivals(self, block: int, epoch_ts: int) -> list[Job]:
        """Jobs arriving in [epoch + block h, epoch + (block+1) h), in time order."""
        rng = np.random.default_rng([self.seed, STREAM_ARRIVALS, block])
        minute_start = block * BLOCK_SECONDS + 60 * np.arange(BLOCK_SECONDS // 60)
        factor = self.profile.factor(minute_start)
        jobs: list[Job] = []
        for model in self.models:
            rows = self.compatible[model]
            lam = self.rate_per_second[model] * factor * 60.0
            counts = rng.poisson(lam) if len(rows) else np.zeros(len(lam), dtype=np.int64)
            n = int(counts.sum())
            offsets = np.repeat(minute_start, counts) + rng.integers(0, 60, size=n)
            picked = rows[rng.integers(0, len(rows), size=n)] if n else np.zeros(0, dtype=np.int64)
            jobs.extend(
                self._jobs(rng, picked, model, epoch_ts + offsets, f"task-{block:05d}-{model_slug(model)}")
            )
        jobs.sort(key=lambda j: (j.arrival_ts, j.task_id))
        return jobs

    def initial_population(self, epoch_ts: int) -> list[Job]:
        """Jobs already running at the epoch: length-biased shapes (a running job is more
        likely a long one) at a uniform age, filling the target at the epoch's factor."""
        rng = np.random.default_rng([self.seed, STREAM_INITIAL])
        factor = float(self.profile.factor(np.zeros(1))[0])
        jobs: list[Job] = []
        for model in self.models:
            rows = self.compatible[model]
            if not len(rows):
                continue
            target = self.params.target_utilisation * self.baseline_gpus[model] * factor
            weight = self.shapes.gpus[rows] * self.shapes.lifetime_s[rows]
            draws = rows[rng.choice(len(rows), size=max(int(target * 4) + 8, 8), p=weight / weight.sum())]
            cumulative = np.cumsum(self.shapes.gpus[draws])
            picked = draws[: int(np.searchsorted(cumulative, target)) + 1] if target > 0 else draws[:0]
            age = (rng.random(len(picked)) * self.shapes.lifetime_s[picked]).astype(np.int64)
            jobs.extend(self._jobs(rng, picked, model, epoch_ts - age, f"task-init-{model_slug(model)}"))
        jobs.sort(key=lambda j: (j.arrival_ts, j.task_id))
        return jobs

    def _jobs(
        self, rng: np.random.Generator, rows: np.ndarray, model: str, arrival_ts: np.ndarray, id_prefix: str
    ) -> list[Job]:
        n = len(rows)
        if n == 0:
            return []
        shapes = self.shapes
        qos = shapes.qos[rows]
        tenants = self.tenants.pick(rng, model, qos)
        qos_names = [QOS_VALUES[q] for q in qos]
        multi = shapes.num_gpu[rows] > 1
        p_inference = np.array([INFERENCE_SHARE_BY_QOS[q] for q in qos_names])
        inference = (rng.random(n) < p_inference) & ~multi
        idle = rng.random(n) < self.params.idle_task_share
        util = np.where(inference, rng.beta(2.0, 3.0, n), rng.beta(6.0, 2.0, n)) * 100.0
        util = np.where(idle, rng.uniform(0.5, 8.0, n), util)
        checkpoint = np.where(
            inference,
            rng.lognormal(np.log(2.0), 0.5, n),
            rng.lognormal(np.log(20.0), 0.8, n) * shapes.num_gpu[rows] ** 0.3,
        )
        draws = rng.random((4, n))
        jobs = []
        for i, row in enumerate(rows):
            tenant, q = tenants[i], qos_names[i]
            elastic_qos = q in ELASTIC_QOS
            drainable = bool(elastic_qos and self.tenants.drain_tolerant.get(tenant, False))
            rigid_ls = q == "LS" and self.tenants.rigid.get(tenant, False)
            jobs.append(
                Job(
                    task_id=f"{id_prefix}-{i:05d}",
                    tenant_id=tenant,
                    gpu_model=model,
                    num_gpu=int(shapes.num_gpu[row]),
                    gpu_milli=int(shapes.gpu_milli[row]),
                    cpu_milli=int(shapes.cpu_milli[row]),
                    mem_mib=int(shapes.mem_mib[row]),
                    qos=q,
                    kind="inference" if inference[i] else "training",
                    resource_class="drainable" if drainable else "guaranteed",
                    priority=PRIORITY_BY_QOS[q],
                    do_not_drain=bool(q == "Guaranteed" or (rigid_ls and draws[0, i] < 0.3)),
                    checkpointable=bool(inference[i] or draws[1, i] < 0.85),
                    lifetime_s=int(shapes.lifetime_s[row]),
                    arrival_ts=int(arrival_ts[i]),
                    util_level=round(float(util[i]), 3),
                    gpu_mem_share=round(0.4 + 0.55 * float(draws[2, i]), 4),
                    checkpoint_s=round(float(checkpoint[i]), 3),
                    exit_s=round(float(rng.lognormal(np.log(5.0), 0.7)), 3),
                    ignores_sigterm=bool(draws[3, i] < 0.03),
                )
            )
        return jobs
