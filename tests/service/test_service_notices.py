"""The notice file beside the warehouse (warehouse/notice_outbox.py) and the delivery worker's
two sources: a warning reaches its receiver while a drain still holds the warehouse file,
woken by the bell (not a timer); a warning the notice file missed is delivered from the
warehouse's outbox; one both hold is one job, sent once."""

from __future__ import annotations

import datetime as dt
import subprocess
import sys
import threading
import time

import pytest
from service_harness.kit import ACME, Receiver

from market_pipeline.service.context import ServiceContext
from market_pipeline.service.webhooks import DeliveryWorker
from market_pipeline.warehouse import open_warehouse
from market_pipeline.warehouse.drain_outbox import DrainWarning, write_drain_warning
from market_pipeline.warehouse.notice_outbox import Bell, NoticeOutbox, notices_path

UTC = dt.timezone.utc
HOLD_FILE = (
    "import duckdb, sys; con = duckdb.connect(sys.argv[1]); print('held', flush=True); sys.stdin.read()"
)


def _warning(drain_id: str) -> DrainWarning:
    at = dt.datetime.now(UTC)
    return DrainWarning(
        drain_id=drain_id,
        decision_id=None,
        tenant_id=ACME,
        task_id=f"task-{drain_id}",
        node_id="node-1",
        pool_id="A100@cn-beijing-a",
        warned_at=at,
        notice_seconds=30.0,
        expected_drain_at=at + dt.timedelta(seconds=30),
        reasons=("under_used: test",),
        longer_notice="declare the task checkpointable",
    )


@pytest.fixture
def setup(service_config, tmp_path):
    """A warehouse, the service's store with ACME's receiver registered, and a worker whose
    timers are a minute long: what arrives sooner came through the bell."""
    warehouse = open_warehouse(tmp_path / "w.duckdb")
    service = service_config.service.model_copy(
        update={
            "store_path": str(tmp_path / "s.sqlite"),
            "webhook_poll_seconds": 60.0,
            "webhook_reconcile_seconds": 60.0,
            "read_retry_seconds": 0.2,
        }
    )
    context = ServiceContext.build(
        service_config.model_copy(update={"service": service}), str(warehouse.path)
    )
    receiver = Receiver().start()
    context.store.register_webhook(ACME, receiver.url)
    worker = DeliveryWorker(context.warehouse, context.store, context.config.service)
    yield warehouse, context, receiver, worker
    receiver.stop()


def test_a_notice_reaches_its_receiver_while_a_drain_holds_the_warehouse(setup):
    warehouse, context, receiver, worker = setup
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_FILE, str(warehouse.path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    stop = threading.Event()
    thread = threading.Thread(target=worker.run, args=(stop,), daemon=True)
    try:
        assert holder.stdout.readline().strip() == "held"  # another process has the DuckDB file
        thread.start()
        NoticeOutbox(notices_path(warehouse.path)).put(_warning("held-1"))
        deadline = time.monotonic() + 30  # far inside the worker's 60 s timers
        while not receiver.calls and time.monotonic() < deadline:
            time.sleep(0.02)
        assert holder.poll() is None  # the file is still held: the notice did not wait for it
        assert [c["headers"]["x-mp-notice-id"] for c in receiver.calls] == ["drain-warning:held-1"]
    finally:
        holder.stdin.close()
        holder.wait(timeout=30)
        stop.set()
        thread.join(timeout=30)
    assert not thread.is_alive()  # the stop rang the bell: no 60 s timer waited out


def test_a_warning_the_notice_file_missed_comes_from_the_warehouse_outbox(setup):
    """A drain's process died between its commit and the notice file: 0 lost all the same."""
    warehouse, context, receiver, worker = setup
    with warehouse.connect() as con:
        write_drain_warning(con, _warning("missed-1"))
    assert worker.take_notices() == 0 and not notices_path(warehouse.path).exists()
    assert worker.poll_outbox() == 1
    assert worker.deliver_due() == 1
    assert [c["headers"]["x-mp-notice-id"] for c in receiver.calls] == ["drain-warning:missed-1"]


def test_a_warning_in_both_outboxes_is_one_job_sent_once(setup):
    warehouse, context, receiver, worker = setup
    warning = _warning("both-1")
    with warehouse.connect() as con:
        write_drain_warning(con, warning)
    assert NoticeOutbox(notices_path(warehouse.path)).put(warning)
    assert worker.take_notices() == 1 and worker.deliver_due() == 1
    assert worker.poll_outbox() == 1  # the warehouse's row is taken too, and adds no job
    assert worker.deliver_due() == 0 and worker.take_notices() == 0
    jobs = context.store.read("SELECT notice_id, state FROM webhook_jobs")
    assert jobs == [("drain-warning:both-1", "delivered")]
    assert len(receiver.calls) == 1


def test_a_new_notice_file_at_the_same_path_is_read_from_its_start(setup):
    """Each file has its own id and cursor: a warehouse made afresh (its notice file with
    it) starts at row 1 again, and that row is not taken for one already seen."""
    warehouse, context, receiver, worker = setup
    path = notices_path(warehouse.path)
    NoticeOutbox(path).put(_warning("old-1"))
    NoticeOutbox(path).put(_warning("old-2"))
    assert worker.take_notices() == 2
    for leftover in path.parent.glob(path.name + "*"):
        leftover.unlink()
    NoticeOutbox(path).put(_warning("new-1"))
    assert worker.take_notices() == 1 and worker.deliver_due() == 3
    assert sorted(c["headers"]["x-mp-notice-id"] for c in receiver.calls) == [
        "drain-warning:new-1",
        "drain-warning:old-1",
        "drain-warning:old-2",
    ]


def test_a_put_is_once_per_drain_and_rings_the_bell(tmp_path):
    outbox = NoticeOutbox(notices_path(tmp_path / "w.duckdb"))
    bell = Bell(outbox.path)
    try:
        assert bell.listening and not Bell(outbox.path).listening  # one listener per file
        assert not bell.wait(0.01)
        assert outbox.put(_warning("d-1")) and outbox.put(_warning("d-1"))
        assert bell.wait(5.0)  # rung (the two rings are read as one)
        assert not bell.wait(0.01)
        assert [w.drain_id for w in outbox.after(0)] == ["d-1"]
    finally:
        bell.close()


def test_an_unwritable_notice_file_is_logged_not_raised(tmp_path, caplog):
    """The drain goes on; the warehouse's outbox has the warning."""
    blocked = tmp_path / "blocked"
    blocked.write_text("a file where the notice file's folder should be")
    outbox = NoticeOutbox(notices_path(blocked / "w.duckdb"))
    assert outbox.put(_warning("d-2")) is False
    assert "d-2" in caplog.text and "the warehouse outbox has it" in caplog.text
