"""What the scaling and drain sensors and their batch ops share.

A sensor asks for one run per batch (a tick's approved decisions of one kind), run_key =
the batch id, so Dagster launches each batch once however often the sensor ticks. A batch
run that failed before it settled every decision gets a resume run (`<batch id>#resume<n>`,
at most RESUME_LIMIT); inside, decisions already executed are skipped by their claim.
"""

from collections.abc import Callable, Sequence

import dagster as dg

from assets.lib.tags import tick_tags
from market_pipeline.action_batches import ActionBatch, ActionResult, counts_by_status, failing

RESUME_LIMIT = 3
UNFINISHED_RUN = frozenset({dg.DagsterRunStatus.FAILURE, dg.DagsterRunStatus.CANCELED})
LIVE_RUN = frozenset(
    {
        dg.DagsterRunStatus.QUEUED,
        dg.DagsterRunStatus.NOT_STARTED,
        dg.DagsterRunStatus.STARTING,
        dg.DagsterRunStatus.STARTED,
        dg.DagsterRunStatus.CANCELING,
    }
)
TABLE_LIMIT = 500  # rows of the outcome table in a run's metadata (the counts cover all)


class ActionBatchConfig(dg.Config):
    tick: str  # ISO time the batch's decisions were made at (decisions.decided_at)


def batch_run_key(instance: dg.DagsterInstance, batch_tag: str, batch_id: str) -> str | None:
    """The batch id, or a resume key after a failed run; None once resumes are spent."""
    runs = instance.get_runs(filters=dg.RunsFilter(tags={batch_tag: batch_id}), limit=RESUME_LIMIT + 1)
    if not runs or runs[0].status not in UNFINISHED_RUN:
        return batch_id  # first launch, or a run in flight / done: Dagster dedupes it
    if len(runs) > RESUME_LIMIT:
        return None
    return f"{batch_id}#resume{len(runs)}"


def batch_requests(
    context: dg.SensorEvaluationContext, batches: Sequence[ActionBatch], *, prefix: str, op_name: str
) -> tuple[list[dg.RunRequest], list[str]]:
    """One RunRequest per batch (tags `<prefix>/batch_id`, `/tick`, `/decisions`), and the
    batches given up after RESUME_LIMIT failed resumes."""
    requests, given_up = [], []
    for batch in batches:
        run_key = batch_run_key(context.instance, f"{prefix}/batch_id", batch.batch_id)
        if run_key is None:
            given_up.append(batch.batch_id)
            continue
        tick = batch.tick.isoformat()
        requests.append(
            dg.RunRequest(
                run_key=run_key,
                run_config=dg.RunConfig(ops={op_name: ActionBatchConfig(tick=tick)}),
                tags={
                    f"{prefix}/batch_id": batch.batch_id,
                    f"{prefix}/tick": tick,
                    **tick_tags(batch.tick),
                    f"{prefix}/decisions": str(len(batch.decision_ids)),
                },
            )
        )
    return requests, given_up


def sensor_result(
    context: dg.SensorEvaluationContext,
    read_pending: Callable[[], Sequence[ActionBatch]],
    *,
    prefix: str,
    op_name: str,
    what: str,
    given_up_hint: str,
) -> dg.SkipReason | list[dg.RunRequest]:
    """A batch sensor's whole decision: the pending batches, one request each (resumes after
    a failed run), a warning for batches past RESUME_LIMIT, or why nothing is launched."""
    from market_pipeline.warehouse import WarehouseError

    try:
        pending = read_pending()
    except WarehouseError as exc:
        return dg.SkipReason(f"warehouse not readable: {exc}")
    requests, given_up = batch_requests(context, pending, prefix=prefix, op_name=op_name)
    if given_up:
        context.log.warning(
            "%s batches left after %d failed runs (%s): %s", what, RESUME_LIMIT + 1, given_up_hint, given_up
        )
    return requests or dg.SkipReason(f"no approved {what} action is waiting")


def run_is_live(instance: dg.DagsterInstance) -> Callable[[str], bool]:
    """Whether a run that holds a claim may still record its outcome."""

    def live(run_id: str) -> bool:
        run = instance.get_run_by_id(run_id)
        return run is not None and run.status in LIVE_RUN

    return live


def batch_output(
    context: dg.OpExecutionContext, what: str, batch_id: str, results: Sequence[ActionResult]
) -> dg.Output[None]:
    """The operator's view of a batch run (counts by outcome, a table of every action); the
    run fails, after every action is recorded, only when an action failed or raised."""
    counts = counts_by_status(results)
    metadata = {
        "batch_id": batch_id,
        "actions": len(results),
        "counts_by_outcome": dg.MetadataValue.json(counts),
        "outcomes": dg.MetadataValue.table(
            records=[
                dg.TableRecord(
                    {
                        "decision_id": r.decision_id,
                        "action": r.action.value,
                        "target": r.target,
                        "status": r.status.value,
                        "detail": r.detail,
                    }
                )
                for r in results[:TABLE_LIMIT]
            ],
            schema=dg.TableSchema(
                columns=[
                    dg.TableColumn(name) for name in ("decision_id", "action", "target", "status", "detail")
                ]
            ),
        ),
    }
    context.log.info("%s %s: %s", what, batch_id, counts)
    bad = failing(results)
    if bad:
        raise dg.Failure(
            description=f"{what} {batch_id}: {len(bad)} of {len(results)} actions did not "
            f"complete; first: {bad[0].decision_id}: {bad[0].outcome}",
            metadata=metadata,
        )
    return dg.Output(None, metadata=metadata)
