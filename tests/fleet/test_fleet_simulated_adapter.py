"""The simulated adapter: determinism, persistence, re-reads, schema, operations."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import polars as pl
import pytest

from market_pipeline.config import load_config
from market_pipeline.fleet.state import TwinStateError
from market_pipeline.fleet.twin_adapter import SampleWindowExpired, SimulatedAdapter
from market_pipeline.fleet.workload import Job
from market_pipeline.hardware import AdapterBackendError, backend_class, make_adapter
from market_pipeline.hardware.protocol import (
    REQUIRED_SAMPLE_COLUMNS,
    SAMPLE_SCHEMA,
    TASK_EVENT_SCHEMA,
    NodeAdapter,
    NodeState,
    OutcomeStatus,
)

EPOCH = datetime(2026, 1, 5, tzinfo=UTC)
HOUR = timedelta(hours=1)


def _adapter(path: Path, **kw) -> SimulatedAdapter:
    return SimulatedAdapter(load_config(), path / "fleet.json", epoch=EPOCH, **kw)


def test_fleet_same_seed_same_samples_whatever_the_chunking(tmp_path: Path) -> None:
    one = _adapter(tmp_path / "a").read_samples(EPOCH, EPOCH + 3 * HOUR)
    chunked = _adapter(tmp_path / "b")
    parts = [chunked.read_samples(EPOCH + i * HOUR, EPOCH + (i + 1) * HOUR) for i in range(3)]
    assert one.height == 104 * 180  # ON GPUs x samples per minute for 3 h
    assert one.equals(pl.concat(parts))


def test_fleet_other_seed_other_samples(tmp_path: Path) -> None:
    base = _adapter(tmp_path / "a").read_samples(EPOCH, EPOCH + HOUR)
    config = load_config(environ={"MP__ADAPTER__SEED": "8"})
    other = SimulatedAdapter(config, tmp_path / "b" / "f.json", epoch=EPOCH).read_samples(EPOCH, EPOCH + HOUR)
    assert base.shape == other.shape and not base.equals(other)


def test_fleet_samples_match_the_schema_and_are_plausible(tmp_path: Path) -> None:
    samples = _adapter(tmp_path).read_samples(EPOCH, EPOCH + 2 * HOUR)
    assert dict(samples.schema) == SAMPLE_SCHEMA
    assert (
        samples.select(pl.col(c).null_count() for c in REQUIRED_SAMPLE_COLUMNS).sum_horizontal().item() == 0
    )
    assert samples["sm_util_pct"].is_between(0, 100).all()
    assert (samples["mem_used_mib"] <= samples["mem_total_mib"]).all()
    assert samples.filter(pl.col("task_id").is_null())["sm_util_pct"].max() == 0.0
    busy = samples.filter(pl.col("task_id").is_not_null())
    assert busy.height > samples.height / 3 and busy["sm_util_pct"].mean() > 20
    assert samples.group_by("ts", "gpu_uuid").len()["len"].max() == 1
    mig = samples.filter(pl.col("mig_profile").is_not_null())["mig_profile"]
    assert mig.len() > 0 and mig.str.contains("g.").all()  # fractional A100/H800 tasks use MIG


def test_fleet_state_persists_and_reload_continues_identically(tmp_path: Path) -> None:
    straight = _adapter(tmp_path / "a").read_samples(EPOCH, EPOCH + 4 * HOUR)
    first = _adapter(tmp_path / "b")
    early = first.read_samples(EPOCH, EPOCH + 2 * HOUR)
    task = first.list_tasks()[0]
    reloaded = _adapter(tmp_path / "b")  # a new process would do the same
    assert reloaded.now() == EPOCH + 2 * HOUR
    assert task in reloaded.list_tasks()
    late = reloaded.read_samples(EPOCH + 2 * HOUR, EPOCH + 4 * HOUR)
    assert straight.equals(pl.concat([early, late]))
    again = _adapter(tmp_path / "b").read_samples(EPOCH + HOUR, EPOCH + 3 * HOUR)
    assert again.equals(
        straight.filter(pl.col("ts").is_between(EPOCH + HOUR, EPOCH + 3 * HOUR, closed="left"))
    )


def test_fleet_two_adapters_on_one_state_see_each_other(tmp_path: Path) -> None:
    left, right = _adapter(tmp_path), _adapter(tmp_path)
    left.advance(EPOCH + HOUR)
    assert right.now() == EPOCH + HOUR
    node = right.list_nodes()[0].node_id
    assert right.cordon(node).ok
    assert next(n for n in left.list_nodes() if n.node_id == node).cordoned


def test_fleet_old_windows_expire_with_a_clear_error(tmp_path: Path) -> None:
    adapter = _adapter(tmp_path, sample_buffer_hours=2)
    adapter.advance(EPOCH + timedelta(hours=4))
    with pytest.raises(SampleWindowExpired, match="no longer buffered"):
        adapter.read_samples(EPOCH, EPOCH + HOUR)
    assert adapter.read_samples(EPOCH + timedelta(hours=3), EPOCH + timedelta(hours=4)).height == 104 * 60
    assert len(list((tmp_path / "fleet.d" / "samples").glob("*.parquet"))) <= 3  # old hours pruned
    assert adapter.read_samples(EPOCH - 2 * HOUR, EPOCH - HOUR).height == 0  # before the fleet existed


def test_fleet_state_of_another_fleet_is_refused(tmp_path: Path) -> None:
    _adapter(tmp_path).advance(EPOCH + HOUR)
    config = load_config(environ={"MP__ADAPTER__SEED": "99"})
    with pytest.raises(TwinStateError, match="seed"):
        SimulatedAdapter(config, tmp_path / "fleet.json", epoch=EPOCH).now()


def test_fleet_unknown_ids_are_gone(tmp_path: Path) -> None:
    adapter = _adapter(tmp_path)
    for outcome in (
        adapter.warn_task("nope", 30),
        adapter.checkpoint_task("nope", 30),
        adapter.terminate_task("nope", 30),
        adapter.kill_task("nope"),
        adapter.cordon("nope"),
        adapter.uncordon("nope"),
        adapter.power_on("nope"),
        adapter.power_off("nope"),
        adapter.verify_released(["GPU-nope"]),
    ):
        assert outcome.status is OutcomeStatus.GONE, outcome
    assert adapter.task_catalog(["nope"]) == []


def test_fleet_drain_sequence_records_events_and_frees_gpus(tmp_path: Path) -> None:
    adapter = _adapter(tmp_path)
    adapter.advance(EPOCH + HOUR)
    task = next(t for t in adapter.list_tasks() if t.checkpointable)
    assert not adapter.verify_released(task.gpu_uuids).ok
    assert adapter.warn_task(task.task_id, 30).ok
    checkpoint = adapter.checkpoint_task(task.task_id, 3600)
    assert checkpoint.ok and checkpoint.seconds > 0
    terminate = adapter.terminate_task(task.task_id, 3600)
    if terminate.status is OutcomeStatus.TIMEOUT:  # a task that ignores SIGTERM
        assert adapter.kill_task(task.task_id).ok
    assert adapter.verify_released(task.gpu_uuids).ok
    assert adapter.kill_task(task.task_id).status is OutcomeStatus.GONE
    events = adapter.read_task_events(EPOCH + HOUR, EPOCH + 2 * HOUR).filter(
        pl.col("task_id") == task.task_id
    )
    assert dict(events.schema) == TASK_EVENT_SCHEMA
    assert events["event"].to_list()[:2] == ["drain_signal", "drained"]
    ended = adapter.task_catalog([task.task_id])
    assert ended == [task]  # attributes of an ended task stay available for metering


def test_fleet_kill_without_warning_is_a_platform_fault(tmp_path: Path) -> None:
    adapter = _adapter(tmp_path)
    task = adapter.list_tasks()[0]
    assert adapter.kill_task(task.task_id).ok
    events = adapter.read_task_events(EPOCH, EPOCH + timedelta(minutes=1)).filter(
        pl.col("task_id") == task.task_id
    )
    failed = events.filter(pl.col("event") == "failed")
    assert failed.height == 1 and failed["platform_fault"].item()


def test_fleet_power_and_cordon(tmp_path: Path) -> None:
    adapter = _adapter(tmp_path)
    nodes = {n.node_id: n for n in adapter.list_nodes()}
    assert nodes["a100-hz-a-06"].state is NodeState.WARM and nodes["a100-hz-a-07"].state is NodeState.OFF
    assert adapter.power_on("a100-hz-a-06").seconds == 60
    assert adapter.power_on("a100-hz-a-07").seconds == 600
    adapter.advance(EPOCH + timedelta(seconds=120))
    states = {n.node_id: n.state for n in adapter.list_nodes()}
    assert states["a100-hz-a-06"] is NodeState.ON and states["a100-hz-a-07"] is NodeState.OFF
    adapter.advance(EPOCH + timedelta(seconds=660))
    assert {n.node_id: n.state for n in adapter.list_nodes()}["a100-hz-a-07"] is NodeState.ON
    busy = adapter.list_tasks()[0].node_id
    assert adapter.power_off(busy).status is OutcomeStatus.FAILED  # drain first
    assert adapter.power_off("a100-hz-a-08").ok  # already off is fine
    assert adapter.cordon(busy).ok
    adapter.advance(EPOCH + 3 * HOUR)
    assert all(
        t.node_id != busy or t.started_at < EPOCH + timedelta(seconds=660) for t in adapter.list_tasks()
    )  # nothing new lands on a cordoned node


def test_fleet_factory_builds_the_configured_backend(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MARKET_PIPELINE_HOME", str(tmp_path))
    adapter = make_adapter(load_config())
    assert isinstance(adapter, SimulatedAdapter) and isinstance(adapter, NodeAdapter)
    with pytest.raises(AdapterBackendError, match="unknown backend"):
        backend_class("quantum")


def test_fleet_builtin_workload_needs_no_shared_data(tmp_path: Path) -> None:
    adapter = _adapter(tmp_path)
    assert adapter.setup.workload.shapes.source == "builtin"
    assert adapter.setup.catalog.source == "config"
    assert len(adapter.list_tasks()) > 0 and adapter.read_samples(EPOCH, EPOCH + HOUR).height > 0


def test_fleet_refused_tenant_gets_no_new_tasks_and_it_persists(tmp_path: Path) -> None:
    adapter = _adapter(tmp_path)
    adapter.advance(EPOCH + HOUR)
    before = {t.task_id for t in adapter.list_tasks()}
    tenants = sorted({t.tenant_id for t in adapter.list_tasks()})
    refused = tenants[0]
    assert adapter.set_refused_tenants({refused: "balance 0.00 cannot cover the next interval"}).ok
    # a fresh adapter on the same state file sees the refusal (it is part of the twin's state)
    reopened = _adapter(tmp_path)
    reopened.advance(EPOCH + 4 * HOUR)
    started = [t for t in reopened.list_tasks() if t.task_id not in before]
    assert started and all(t.tenant_id != refused for t in started)
    assert reopened.stats()["refused"] > 0
    assert reopened.set_refused_tenants({}).ok
    reopened.advance(EPOCH + 8 * HOUR)
    assert any(t.tenant_id == refused and t.task_id not in before for t in reopened.list_tasks())


def test_fleet_batch_writes_the_state_at_checkpoints_and_at_the_end(tmp_path: Path) -> None:
    """A batch of operations holds the lock and commits once, not after each operation; what
    a checkpoint or the end committed is what another process sees."""
    adapter = _adapter(tmp_path)
    nodes = [n.node_id for n in adapter.list_nodes()][:3]
    before = adapter.store.peek_generation()
    with adapter.batch() as checkpoint:
        assert adapter.cordon(nodes[0]).ok and adapter.cordon(nodes[1]).ok
        assert adapter.store.peek_generation() == before  # nothing written per operation
        checkpoint()
        after_checkpoint = adapter.store.peek_generation()
        assert after_checkpoint == before + 1
        assert adapter.cordon(nodes[2]).ok
    assert adapter.store.peek_generation() == after_checkpoint + 1
    seen = {n.node_id: n.cordoned for n in _adapter(tmp_path).list_nodes()}
    assert all(seen[n] for n in nodes)


def test_fleet_waiting_guaranteed_lists_the_pending_guaranteed_jobs_oldest_first(tmp_path: Path) -> None:
    adapter = _adapter(tmp_path)
    start = int(EPOCH.timestamp())
    template = Job.from_json(
        {
            **{name: 0 for name in Job.__dataclass_fields__},
            "task_id": "x",
            "tenant_id": "t",
            "gpu_model": "A100-80GB",
            "num_gpu": 1,
            "gpu_milli": 1000,
            "qos": "LS",
            "kind": "training",
            "resource_class": "guaranteed",
            "do_not_drain": False,
            "checkpointable": True,
            "ignores_sigterm": False,
        }
    )
    pending = [
        replace(template, task_id="young", arrival_ts=start + 300, num_gpu=2, mem_mib=4096),
        replace(template, task_id="elastic", arrival_ts=start, resource_class="drainable"),
        replace(template, task_id="old", arrival_ts=start + 60, gpu_milli=500),
    ]

    def queue(twin) -> None:
        twin.pending.extend(pending)

    adapter._with_twin(queue, mutate=True)
    waiting = adapter.waiting_guaranteed()
    assert [w.task_id for w in waiting] == ["old", "young"]
    assert waiting[0].waiting_since == EPOCH + timedelta(seconds=60) and waiting[0].gpu_milli == 500
    assert (waiting[1].num_gpu, waiting[1].mem_mib) == (2, 4096)
    assert [w.task_id for w in adapter.waiting_guaranteed(limit=1)] == ["old"]
