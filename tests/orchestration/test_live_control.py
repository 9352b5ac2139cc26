"""`make down`'s graceful stop (sensors.live_control.down) against a scripted Dagster GraphQL
API: running schedules and sensors are stopped first (and remembered for `make up`), queued
runs are cancelled, a run in progress is waited for, one that outlives the wait is terminated,
and a failure while stopping is reported. (The real webserver path is checked by hand with
`make up` / `make down`, docs/orchestration.md.)"""

from __future__ import annotations

import json

import pytest

from sensors import live_control


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
