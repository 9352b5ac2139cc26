"""Stopping and resuming the live loop gracefully (`make down`, `make up`).

`python -m assets.harness.live_control down --port P` talks to the live webserver's GraphQL API:
1. it stops every running schedule and sensor, so nothing new is asked for, and records which
   it stopped (`stopped.json` in DAGSTER_HOME);
2. it cancels the runs still queued (they never started: nothing half done);
3. it waits up to `--wait` seconds for the runs in progress to finish, then asks the ones still
   going to terminate (Dagster's safe termination: the run's process is interrupted and the run
   ends CANCELED, its drains resumable from their audit log) and waits for them to end.
It prints one JSON line: what it stopped, waited for and cancelled, and the runs that failed
while it ran. Only then does `make down` interrupt `dagster dev`, whose daemon has nothing left
to launch, and whose code server no sensor is calling.

`python -m assets.harness.live_control resume` (run by `make up` before `dagster dev` starts) puts the
schedules and sensors that `down` stopped back to their status in code (running, under
MARKET_PIPELINE_LIVE=1), keeping their cursors; one an operator stopped by hand stays stopped.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

STOPPED_FILE = "stopped.json"
IN_PROGRESS = ("STARTING", "STARTED", "CANCELING")
QUEUED = ("QUEUED", "NOT_STARTED")

INSTIGATORS = """{ repositoriesOrError { __typename ... on RepositoryConnection { nodes {
  schedules { name scheduleState { id status } } sensors { name sensorState { id status } } } } } }"""
RUNS = """query Runs($statuses: [RunStatus!]) { runsOrError(filter: {statuses: $statuses}) {
  __typename ... on Runs { results { runId status jobName } } } }"""
STOP_SCHEDULE = """mutation Stop($id: String) { stopRunningSchedule(id: $id) { __typename
  ... on PythonError { message } } }"""
STOP_SENSOR = """mutation Stop($id: String) { stopSensor(id: $id) { __typename
  ... on PythonError { message } } }"""
TERMINATE = """mutation Terminate($id: String!) { terminateRun(runId: $id, terminatePolicy: SAFE_TERMINATE) {
  __typename ... on PythonError { message } ... on TerminateRunFailure { message } } }"""


class LiveControlError(RuntimeError):
    """The webserver cannot be reached or refused a request (one line)."""


class GraphQL:
    def __init__(self, url: str, timeout: float = 30.0) -> None:
        self.url = url
        self.timeout = timeout

    def __call__(self, query: str, variables: dict[str, Any] | None = None) -> dict[str, Any]:
        body = json.dumps({"query": query, "variables": variables or {}}).encode()
        request = urllib.request.Request(self.url, data=body, headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                answer = json.loads(response.read())
        except (urllib.error.URLError, OSError, ValueError) as exc:
            raise LiveControlError(f"the Dagster webserver at {self.url} did not answer: {exc}") from exc
        if answer.get("errors"):
            raise LiveControlError(f"GraphQL error: {answer['errors'][0].get('message', answer['errors'])}")
        return answer["data"]


def running_instigators(gql: GraphQL) -> list[tuple[str, str, str]]:
    """(kind, name, state id) of every schedule and sensor that runs now."""
    data = gql(INSTIGATORS)["repositoriesOrError"]
    if data["__typename"] != "RepositoryConnection":
        raise LiveControlError(f"the code location did not load ({data['__typename']})")
    found = []
    for repo in data["nodes"]:
        for schedule in repo["schedules"]:
            if schedule["scheduleState"]["status"] == "RUNNING":
                found.append(("schedule", schedule["name"], schedule["scheduleState"]["id"]))
        for sensor in repo["sensors"]:
            if sensor["sensorState"]["status"] == "RUNNING":
                found.append(("sensor", sensor["name"], sensor["sensorState"]["id"]))
    return found


def runs(gql: GraphQL, statuses: tuple[str, ...]) -> list[dict[str, str]]:
    data = gql(RUNS, {"statuses": list(statuses)})["runsOrError"]
    if data["__typename"] != "Runs":
        raise LiveControlError(f"runs not readable ({data['__typename']})")
    return data["results"]


def _checked(result: dict[str, Any], what: str) -> None:
    if result["__typename"] in ("PythonError", "TerminateRunFailure", "UnauthorizedError"):
        raise LiveControlError(f"{what}: {result.get('message', result['__typename'])}")


def down(gql: GraphQL, home: Path, wait_seconds: float, poll_seconds: float = 1.0) -> dict[str, Any]:
    started = time.monotonic()
    failed_before = {r["runId"] for r in runs(gql, ("FAILURE",))}
    stopped = running_instigators(gql)
    for kind, name, state_id in stopped:
        query = STOP_SCHEDULE if kind == "schedule" else STOP_SENSOR
        key = "stopRunningSchedule" if kind == "schedule" else "stopSensor"
        _checked(gql(query, {"id": state_id})[key], f"stopping {kind} {name}")
    previous = _read_stopped(home)
    ids = {s["id"] for s in previous}
    merged = previous + [{"kind": k, "name": n, "id": i} for k, n, i in stopped if i not in ids]
    (home / STOPPED_FILE).write_text(json.dumps(merged, indent=1))
    cancelled: list[str] = []
    for run in runs(gql, QUEUED):  # never started: cancelled, not failed
        _checked(gql(TERMINATE, {"id": run["runId"]})["terminateRun"], f"cancelling run {run['runId']}")
        cancelled.append(run["runId"])
    waited = runs(gql, IN_PROGRESS)
    deadline = started + wait_seconds
    while runs(gql, IN_PROGRESS) and time.monotonic() < deadline:
        time.sleep(poll_seconds)
    terminated: list[str] = []
    for run in runs(gql, ("STARTING", "STARTED")):
        _checked(gql(TERMINATE, {"id": run["runId"]})["terminateRun"], f"terminating run {run['runId']}")
        terminated.append(run["runId"])
    end = time.monotonic() + 60
    while (left := runs(gql, IN_PROGRESS + QUEUED)) and time.monotonic() < end:
        time.sleep(poll_seconds)
    failed = [r for r in runs(gql, ("FAILURE",)) if r["runId"] not in failed_before]
    return {
        "stopped": [f"{k} {n}" for k, n, _ in stopped],
        "waited_for_runs": [r["runId"] for r in waited],
        "cancelled_queued_runs": cancelled,
        "terminated_runs": terminated,
        "still_in_progress": [r["runId"] for r in left],
        "failed_runs_while_stopping": [f"{r['jobName']} {r['runId']}" for r in failed],
        "seconds": round(time.monotonic() - started, 1),
    }


def _read_stopped(home: Path) -> list[dict[str, str]]:
    path = home / STOPPED_FILE
    if not path.exists():
        return []
    try:
        return list(json.loads(path.read_text()))
    except ValueError:
        return []


def resume(home: Path) -> dict[str, Any]:
    """Back to their status in code: the instigators `down` stopped (their cursors kept)."""
    from dagster import DagsterInstance
    from dagster._core.remote_representation.handle import CompoundID
    from dagster._core.scheduler.instigation import InstigatorStatus

    stopped = _read_stopped(home)
    resumed = []
    if stopped:
        with DagsterInstance.get() as instance:
            for entry in stopped:
                cid = CompoundID.from_string(entry["id"])
                state = instance.get_instigator_state(cid.remote_origin_id, cid.selector_id)
                if state is not None and state.status == InstigatorStatus.STOPPED:
                    instance.update_instigator_state(state.with_status(InstigatorStatus.DECLARED_IN_CODE))
                    resumed.append(f"{entry['kind']} {entry['name']}")
    (home / STOPPED_FILE).unlink(missing_ok=True)
    return {"resumed": resumed}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m assets.harness.live_control", description=__doc__.split("\n")[0]
    )
    sub = parser.add_subparsers(dest="action", required=True)
    stop = sub.add_parser("down", help="stop schedules and sensors, let runs finish or cancel them")
    stop.add_argument("--host", default="127.0.0.1")
    stop.add_argument("--port", type=int, default=3000)
    stop.add_argument("--wait", type=float, default=120.0, help="seconds runs in progress may take to finish")
    sub.add_parser("resume", help="schedules and sensors stopped by `down` back to their status in code")
    args = parser.parse_args(argv)
    home = Path(os.environ.get("DAGSTER_HOME") or "/nonexistent")
    if not os.environ.get("DAGSTER_HOME") or not home.is_dir():
        print(
            f"error: DAGSTER_HOME {os.environ.get('DAGSTER_HOME', '')!r} is not a directory", file=sys.stderr
        )
        return 2
    try:
        if args.action == "down":
            result = down(GraphQL(f"http://{args.host}:{args.port}/graphql"), home, args.wait)
        else:
            result = resume(home)
    except LiveControlError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(result))
    return 1 if result.get("still_in_progress") or result.get("failed_runs_while_stopping") else 0


if __name__ == "__main__":
    sys.exit(main())
