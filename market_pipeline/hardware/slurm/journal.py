"""What the slurm backend remembers between calls, in one JSON file under a lock.

Slurm forgets a finished job's GPUs (its GRES indices) once it ends, and knows nothing of
the drains we ran. The journal keeps, per run of a job (task id `<job id>@<start>`), the
attributes seen while it ran (so ended runs can be metered), the warning times (the billing
grace starts there) and which runs our drains ended; and, per pending drainable job, the begin
time our rule 4 pass gave it (`SlurmAdapter.close_to_drainable`), so that only our own
deferrals are renewed or let go; and the drainable partition's node list as found and as our
rules 5 and 6 pass set it (`SlurmAdapter.keep_drainable_off`), so that only our own change is
undone. Bounded: the oldest runs beyond `MAX_RUNS` are dropped, and a
deferral is dropped once its job no longer waits.
"""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

MAX_RUNS = 100_000


def _empty() -> dict[str, Any]:
    return {
        "runs": {},
        "drain_signals": {},
        "drained": {},
        "deferred": {},
        "kept_off": {},
        "published_until": "",
    }


class Journal:
    def __init__(self, path: Path) -> None:
        self.path = path

    def read(self) -> dict[str, Any]:
        try:
            data = json.loads(self.path.read_text())
        except FileNotFoundError:
            return _empty()
        except ValueError:
            return _empty()  # a torn file cannot happen (atomic replace); an edited one is reset
        for key, value in _empty().items():
            data.setdefault(key, value)
        return data

    @contextmanager
    def edit(self) -> Iterator[dict[str, Any]]:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path.with_name(self.path.name + ".lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            data = self.read()
            yield data
            runs = data["runs"]
            if len(runs) > MAX_RUNS:
                keep = sorted(runs, key=lambda k: runs[k]["started_at"])[-MAX_RUNS:]
                data["runs"] = {k: runs[k] for k in keep}
                for key in ("drain_signals", "drained"):
                    data[key] = {k: v for k, v in data[key].items() if k in data["runs"]}
            tmp = self.path.with_name(self.path.name + f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps(data, separators=(",", ":")))
            os.replace(tmp, self.path)
