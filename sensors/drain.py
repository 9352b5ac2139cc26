"""drain_sensor: one RunRequest of drain_job per approved, not yet executed drain decision.

run_key = decision id, so Dagster launches each decision at most once however often the
sensor ticks; the drain protocol itself is idempotent per decision as a second guard.
A run that died before its drain finished (process killed, fleet unreachable) would
otherwise leave the drain half-way for ever: after such a failed run the sensor asks for
a resume run (`<decision id>#resume<n>`, at most RESUME_LIMIT), which continues the drain
from its audit log without repeating a step. The sensor only reads.
"""

import dagster as dg

from assets.drain import drain_job, drain_run_config
from assets.resources import WarehouseResource
from market_pipeline.guardrails.task_drain_store import pending_drain_decisions
from market_pipeline.warehouse import WarehouseError

DECISION_TAG = "drain/decision_id"
RESUME_LIMIT = 3
UNFINISHED_RUN = frozenset({dg.DagsterRunStatus.FAILURE, dg.DagsterRunStatus.CANCELED})


def drain_run_key(instance: dg.DagsterInstance, decision_id: str) -> str | None:
    """The decision id, or a resume key after a failed run; None once resumes are spent."""
    runs = instance.get_runs(filters=dg.RunsFilter(tags={DECISION_TAG: decision_id}),
                             limit=RESUME_LIMIT + 1)
    if not runs or runs[0].status not in UNFINISHED_RUN:
        return decision_id  # first launch, or a run in flight / done: Dagster dedupes it
    if len(runs) > RESUME_LIMIT:
        return None
    return f"{decision_id}#resume{len(runs)}"


@dg.sensor(job=drain_job, minimum_interval_seconds=30,
           default_status=dg.DefaultSensorStatus.RUNNING)
def drain_sensor(context: dg.SensorEvaluationContext, warehouse: WarehouseResource):
    try:
        pending = pending_drain_decisions(warehouse.reader())
    except WarehouseError as exc:
        return dg.SkipReason(f"warehouse not readable: {exc}")
    requests, given_up = [], []
    for d in pending:
        run_key = drain_run_key(context.instance, d.decision_id)
        if run_key is None:
            given_up.append(d.decision_id)
            continue
        requests.append(dg.RunRequest(
            run_key=run_key,
            run_config=drain_run_config(d.decision_id),
            tags={DECISION_TAG: d.decision_id, "drain/task_id": d.task.task_id,
                  "drain/tenant_id": d.task.tenant_id, "drain/pool_id": d.task.pool_id},
        ))
    if given_up:
        context.log.warning("drains left to an operator after %d failed runs "
                            "(`market-pipeline drain --decision-id ID`): %s",
                            RESUME_LIMIT + 1, given_up)
    if not requests:
        return dg.SkipReason("no approved drain decision is waiting")
    return requests
