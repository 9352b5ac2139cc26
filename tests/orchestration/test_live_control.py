"""`make down`'s graceful stop (assets.harness.live_control.down) against a scripted Dagster GraphQL
API: running schedules and sensors are stopped first (and remembered for `make up`), queued
runs are cancelled, a run in progress is waited for, one that outlives the wait is terminated,
and a failure while stopping is reported. (The real webserver path is checked by hand with
`make up` / `make down`, docs/orchestration.md.)"""

from __future__ import annotations

import json

import pytest

from assets.harness import live_control


class ScriptedDagster:
    """Answers the queries live_control sends; a run in progress finishes after `finish_after`
    looks at the runs (never, if None)."""

    def __init__(self, finish_after: int | None) -> None:
        self.instigators = {
            "schedule": {"tick": "RUNNING", "hourly": "STOPPED"},
            "sensor": {"drain": "RUNNING"},
        }
        self.runs = {"r-run": "STARTED", "r-queued": "QUEUED", "r-old": "FAILURE"}
        self.finish_after = finish_after
        self.looks = 0
        self.calls: list[tuple[str, dict]] = []

    def __call__(self, query: str, variables: dict | None = None) -> dict:
        variables = variables or {}
        self.calls.append((query.split("(")[0].split("{")[0].strip(), variables))
        if "repositoriesOrError" in query:
            return {
                "repositoriesOrError": {
                    "__typename": "RepositoryConnection",
                    "nodes": [
                        {
                            "schedules": [
                                {"name": n, "scheduleState": {"id": f"id-{n}", "status": s}}
                                for n, s in self.instigators["schedule"].items()
                            ],
                            "sensors": [
                                {"name": n, "sensorState": {"id": f"id-{n}", "status": s}}
                                for n, s in self.instigators["sensor"].items()
                            ],
                        }
                    ],
                }
            }
        if "runsOrError" in query:
            self.looks += 1
            if (
                self.finish_after is not None
                and self.looks > self.finish_after
                and self.runs["r-run"] == "STARTED"
            ):
                self.runs["r-run"] = "SUCCESS"
            wanted = set(variables["statuses"])
            results = [
                {"runId": r, "status": s, "jobName": "control_loop_job"}
                for r, s in self.runs.items()
                if s in wanted
            ]
            return {"runsOrError": {"__typename": "Runs", "results": results}}
        if "stopRunningSchedule" in query or "stopSensor" in query:
            kind = "schedule" if "stopRunningSchedule" in query else "sensor"
            name = variables["id"].removeprefix("id-")
            self.instigators[kind][name] = "STOPPED"
            key = "stopRunningSchedule" if kind == "schedule" else "stopSensor"
            return {key: {"__typename": "ScheduleStateResult"}}
        if "terminateRun" in query:
            run = variables["id"]
            self.runs[run] = "CANCELED"
            return {"terminateRun": {"__typename": "TerminateRunSuccess"}}
        raise AssertionError(query)


def test_down_stops_instigators_first_cancels_queued_and_waits_for_the_run(tmp_path):
    dagster = ScriptedDagster(finish_after=4)
    result = live_control.down(dagster, tmp_path, wait_seconds=30, poll_seconds=0.01)
    assert result["stopped"] == ["schedule tick", "sensor drain"]  # the stopped one stays as it was
    assert result["cancelled_queued_runs"] == ["r-queued"]
    assert result["waited_for_runs"] == ["r-run"] and result["terminated_runs"] == []
    assert result["failed_runs_while_stopping"] == [] and result["still_in_progress"] == []
    assert dagster.runs == {"r-run": "SUCCESS", "r-queued": "CANCELED", "r-old": "FAILURE"}
    # nothing was stopped after the first run was looked at: instigators first
    first_stop = next(i for i, (q, _) in enumerate(dagster.calls) if q == "mutation Stop")
    first_terminate = next(i for i, (q, _) in enumerate(dagster.calls) if q == "mutation Terminate")
    assert first_stop < first_terminate
    remembered = json.loads((tmp_path / live_control.STOPPED_FILE).read_text())
    assert [(e["kind"], e["name"]) for e in remembered] == [("schedule", "tick"), ("sensor", "drain")]


def test_a_run_that_outlives_the_wait_is_terminated_not_failed(tmp_path):
    dagster = ScriptedDagster(finish_after=None)
    result = live_control.down(dagster, tmp_path, wait_seconds=0.05, poll_seconds=0.01)
    assert result["terminated_runs"] == ["r-run"] and dagster.runs["r-run"] == "CANCELED"
    assert result["failed_runs_while_stopping"] == []


def test_an_unreachable_webserver_is_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path))
    assert live_control.main(["down", "--port", "9", "--wait", "1"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: the Dagster webserver at http://127.0.0.1:9/graphql did not answer")
    assert len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("home", ["", "/nonexistent/dagster_home"])
def test_down_without_a_dagster_home_says_so(home, monkeypatch, capsys):
    monkeypatch.setenv("DAGSTER_HOME", home)
    assert live_control.main(["resume"]) == 2
    assert "DAGSTER_HOME" in capsys.readouterr().err


def _instigator(name: str, kind: str, status, cursor: str | None = None):  # noqa: ANN001, ANN202
    """A schedule's or sensor's stored state, as the daemon keeps it for a code location."""
    from dagster._core.definitions.run_request import InstigatorType
    from dagster._core.remote_origin import (
        InProcessCodeLocationOrigin,
        LoadableTargetOrigin,
        RemoteInstigatorOrigin,
        RemoteRepositoryOrigin,
    )
    from dagster._core.scheduler.instigation import (
        InstigatorState,
        ScheduleInstigatorData,
        SensorInstigatorData,
    )

    location = InProcessCodeLocationOrigin(
        LoadableTargetOrigin(python_file=__file__), location_name="market_pipeline"
    )
    repository = RemoteRepositoryOrigin(code_location_origin=location, repository_name="__repository__")
    origin = RemoteInstigatorOrigin(repository_origin=repository, instigator_name=name)
    if kind == "schedule":
        data = ScheduleInstigatorData(cron_schedule="0 * * * *")
        return InstigatorState(origin, InstigatorType.SCHEDULE, status, data)
    return InstigatorState(origin, InstigatorType.SENSOR, status, SensorInstigatorData(cursor=cursor))


def test_resume_puts_back_what_down_stopped_and_nothing_else(tmp_path, monkeypatch, capsys):
    """`make up` runs `python -m assets.harness.live_control resume` before `dagster dev` starts: the
    schedules and sensors `down` stopped go back to their status in code (a sensor keeps its
    cursor); one an operator stopped by hand stays stopped; one gone from the code since is
    skipped; the record of what `down` stopped is used once."""
    from dagster import DagsterInstance
    from dagster._core.remote_representation.handle import CompoundID
    from dagster._core.scheduler.instigation import InstigatorStatus

    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path))
    states = {
        "tick": _instigator("tick", "schedule", InstigatorStatus.STOPPED),
        "drain": _instigator(
            "drain", "sensor", InstigatorStatus.STOPPED, cursor="drain@2026-12-04T17:00:00+00:00"
        ),
        "by_hand": _instigator("by_hand", "schedule", InstigatorStatus.STOPPED),
    }
    gone = _instigator("gone", "schedule", InstigatorStatus.STOPPED)  # in the record, not stored
    ids = {
        name: CompoundID(
            remote_origin_id=state.instigator_origin_id, selector_id=state.selector_id
        ).to_string()
        for name, state in {**states, "gone": gone}.items()
    }
    with DagsterInstance.get() as instance:
        for state in states.values():
            instance.add_instigator_state(state)
    record = [
        {"kind": "schedule", "name": "tick", "id": ids["tick"]},
        {"kind": "sensor", "name": "drain", "id": ids["drain"]},
        {"kind": "schedule", "name": "gone", "id": ids["gone"]},
    ]
    (tmp_path / live_control.STOPPED_FILE).write_text(json.dumps(record))

    assert live_control.main(["resume"]) == 0
    assert json.loads(capsys.readouterr().out) == {"resumed": ["schedule tick", "sensor drain"]}
    assert not (tmp_path / live_control.STOPPED_FILE).exists()
    with DagsterInstance.get() as instance:
        stored = {
            name: instance.get_instigator_state(state.instigator_origin_id, state.selector_id)
            for name, state in states.items()
        }
    assert stored["tick"].status == InstigatorStatus.DECLARED_IN_CODE
    assert stored["drain"].status == InstigatorStatus.DECLARED_IN_CODE
    assert stored["drain"].instigator_data.cursor == "drain@2026-12-04T17:00:00+00:00"
    assert stored["by_hand"].status == InstigatorStatus.STOPPED

    # a second `make up` (nothing recorded) changes nothing
    assert live_control.main(["resume"]) == 0
    assert json.loads(capsys.readouterr().out) == {"resumed": []}
