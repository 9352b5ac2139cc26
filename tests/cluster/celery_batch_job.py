"""The job of test_celery_worker_killed.py, run on real dagster-celery workers: one op that
carries out a batch of scale decisions through `action_batches.carry_out` (what the scaling and
drain batch ops do), slowly, so the test can kill the worker mid-batch.

Its environment (set by the test for the workers and for the run's coordinator): the broker
(MP_TEST_CELERY_BROKER), the test's own queue (MP_TEST_CELERY_QUEUE, so no other worker on the
broker takes the step), the warehouse file, the control PostgreSQL and the log. The log has a
line per action (`<pid> acted <decision>`) and one per action the fleet keeps (`<pid> committed
<decision>`): like `SimulatedAdapter.batch`, an action is kept when the batch commits it
(`checkpoint`, just before its outcome is recorded), so a worker killed before that loses it.

`python tests/cluster/celery_batch_job.py` executes the job (the run's coordinator) and prints
its run id and status."""

# No `from __future__ import annotations`: Dagster inspects the context annotation at runtime.
import os
import time
from datetime import UTC, datetime
from pathlib import Path

import dagster as dg
from dagster_celery import celery_executor

from market_pipeline import action_batches as ab
from market_pipeline.config.model import OrchestrationConfig
from market_pipeline.warehouse import open_warehouse
from market_pipeline.warehouse.control import ControlStore
from market_pipeline.warehouse.decisions import DecisionKind, DecisionOutcome

NOW = datetime(2026, 12, 4, 12, tzinfo=UTC)
ACT_SECONDS = 0.3


@dg.op(tags={"dagster-celery/queue": os.environ["MP_TEST_CELERY_QUEUE"]})
def carry_out_batch(context: dg.OpExecutionContext) -> None:
    log = Path(os.environ["MP_TEST_LOG"])
    control = ControlStore(os.environ["MP_TEST_CONTROL_URL"])
    warehouse = open_warehouse(os.environ["MP_TEST_WAREHOUSE"], migrate=False, control=control)
    staged: list[str] = []

    def write(lines: list[str]) -> None:
        with log.open("a") as handle:
            handle.writelines(lines)
            handle.flush()
            os.fsync(handle.fileno())

    def act(row: dict) -> ab.ActionResult:
        write([f"{os.getpid()} acted {row['decision_id']}\n"])
        staged.append(row["decision_id"])
        time.sleep(ACT_SECONDS)
        return ab.result_for(row, DecisionOutcome.OK, "done")

    def checkpoint() -> None:
        write([f"{os.getpid()} committed {decision}\n" for decision in staged])
        staged.clear()

    def run_is_live(run_id: str) -> bool:
        run = context.instance.get_run_by_id(run_id)
        return run is not None and not run.is_finished

    rows = ab.batch_rows(warehouse, DecisionKind.SCALE, NOW)
    results = ab.carry_out(
        warehouse, rows, batch_id="scale@t", run_id=context.run_id,
        now=NOW, run_is_live=run_is_live, resumable=True, act=act, checkpoint=checkpoint,
    )  # fmt: skip
    # the batch's promise, checked where it is kept: every decision of the batch has one result
    answered = sorted(r.decision_id for r in results)
    assert answered == sorted(row["decision_id"] for row in rows), f"batch left unanswered: {answered}"


@dg.job(
    executor_def=celery_executor.configured(
        OrchestrationConfig(celery_broker=os.environ["MP_TEST_CELERY_BROKER"]).celery_executor_config()
    )
)
def batch_job() -> None:
    carry_out_batch()


if __name__ == "__main__":
    with dg.DagsterInstance.get() as instance:
        result = dg.execute_job(dg.reconstructable(batch_job), instance=instance)
        print(f"run {result.run_id} {instance.get_run_by_id(result.run_id).status.value}")  # noqa: T201
