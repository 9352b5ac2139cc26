"""Job shapes, tenants and arrivals of the workload model."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pytest

from market_pipeline.config import load_config
from market_pipeline.fleet.arrivals import diurnal_profile, helios_profile
from market_pipeline.fleet.catalog import catalog_from_pools
from market_pipeline.fleet.shapes import QOS_VALUES, WorkloadError, builtin_shapes, load_openb_pods
from market_pipeline.fleet.twin_adapter import SimulatedAdapter
from market_pipeline.fleet.workload import WorkloadModel, WorkloadParams


def _model(seed: int = 3) -> WorkloadModel:
    config = load_config()
    shapes = builtin_shapes(np.random.default_rng(seed))
    return WorkloadModel(
        shapes, catalog_from_pools(config), config.tenants, WorkloadParams(), diurnal_profile(), seed
    )


def test_fleet_builtin_shapes_follow_the_openb_mix() -> None:
    shapes = builtin_shapes(np.random.default_rng(0), size=20_000)
    single = shapes.num_gpu == 1
    fractional = single & (shapes.gpu_milli < 1000)
    assert 0.40 < fractional.sum() / single.sum() < 0.48  # 44% of single-GPU pods in openb
    assert set(np.unique(shapes.num_gpu)) == {1, 2, 4, 8}
    assert (shapes.gpu_milli[shapes.num_gpu > 1] == 1000).all()
    be = shapes.qos == QOS_VALUES.index("BE")
    assert 0.70 < be[fractional].mean() < 0.80  # fractional pods are mostly best effort
    assert (shapes.lifetime_s >= 60).all() and 300 < np.median(shapes.lifetime_s) < 1200


def test_fleet_openb_pod_list_lifetimes(tmp_path: Path) -> None:
    csv = tmp_path / "pods.csv"
    csv.write_text(
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time\n"
        "p0,4000,1024,1,460,,BE,Running,100,1100,200\n"
        "p1,8000,2048,2,1000,V100M32|V100M16,LS,Pending,100,600,\n"
        "p2,1000,512,0,0,,LS,Running,0,10,0\n"
    )
    shapes = load_openb_pods(csv)
    assert shapes.lifetime_s.tolist() == [900, 500, 60]  # - scheduled, - creation, floor
    assert shapes.request(1).models == ("V100M32", "V100M16")
    assert len(shapes.gpu_jobs()) == 2


def test_fleet_openb_pod_list_rejects_unknown_qos(tmp_path: Path) -> None:
    csv = tmp_path / "pods.csv"
    csv.write_text(
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time\n"
        "p0,4000,1024,1,460,,Premium,Running,100,1100,200\n"
    )
    with pytest.raises(WorkloadError, match="unknown qos values \\['Premium'\\]"):
        load_openb_pods(csv)
    with pytest.raises(WorkloadError, match="missing columns"):
        (tmp_path / "short.csv").write_text("name,qos\np,LS\n")
        load_openb_pods(tmp_path / "short.csv")


def test_fleet_tenants_follow_qos_and_drain_tolerance() -> None:
    config = load_config()
    elastic = {t.id for t in config.tenants if t.kind == "elastic"}
    jobs = _model().block_arrivals(0, 1_700_000_000) + _model().block_arrivals(1, 1_700_000_000)
    assert len(jobs) > 20
    for job in jobs:
        if job.qos in ("BE", "Burstable"):
            assert job.tenant_id in elastic and job.resource_class == "drainable"
        else:
            assert job.tenant_id not in elastic and job.resource_class == "guaranteed"
        claims = next(t for t in config.tenants if t.id == job.tenant_id).claims
        assert job.gpu_model in claims  # tenants only get models they claim
        if job.num_gpu > 1:
            assert job.kind == "training"


def test_fleet_arrivals_are_a_pure_function_of_seed_and_hour() -> None:
    first, second = _model(5).block_arrivals(7, 0), _model(5).block_arrivals(7, 0)
    assert [j.to_json() for j in first] == [j.to_json() for j in second]
    assert [j.task_id for j in _model(6).block_arrivals(7, 0)] != [j.task_id for j in first]
    assert all(7 * 3600 <= j.arrival_ts < 8 * 3600 for j in first)


def test_fleet_diurnal_profile_peaks_at_the_peak_hour() -> None:
    profile = diurnal_profile(0.3, 6.0)
    hours = np.arange(24) * 3600
    factor = profile.factor(hours)
    assert int(np.argmax(factor)) == 6 and int(np.argmin(factor)) == 18
    assert abs(factor.mean() - 1.0) < 1e-9


def test_fleet_helios_profile_replays_running_plus_pending(tmp_path: Path) -> None:
    csv = tmp_path / "vc.csv"
    csv.write_text(
        "time,running_gpu_num,pending_gpu_num,total_gpu_num\n"
        "2020-05-01 00:00:00,10,0,64\n2020-05-01 00:01:00,20,10,64\n"
    )
    profile = helios_profile(csv)
    assert profile.factor(np.array([0, 60, 120])).tolist() == pytest.approx([0.5, 1.5, 0.5])
    with pytest.raises(WorkloadError, match="cannot read columns"):
        (tmp_path / "other.csv").write_text("time,x\n1,2\n")
        helios_profile(tmp_path / "other.csv")


def test_fleet_helios_arrivals_drive_the_twin(shared_data: Path, tmp_path: Path) -> None:
    epoch = datetime(2026, 1, 5, tzinfo=UTC)
    params = WorkloadParams(arrival_source=str(shared_data / "helios-earth" / "vc6YE.csv"))
    adapter = SimulatedAdapter(load_config(), tmp_path / "f.json", epoch=epoch, workload_params=params)
    assert adapter.setup.workload.profile.kind == "helios"
    adapter.advance(epoch + timedelta(hours=2))
    assert adapter.stats()["arrived"] > 0
