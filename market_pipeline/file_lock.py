"""An exclusive advisory file lock (`flock`) that waits a bounded time, for state files several
processes share (the twin's JSON state, the local-process task registry)."""

from __future__ import annotations

import contextlib
import fcntl
import time
from collections.abc import Callable, Iterator
from pathlib import Path


@contextlib.contextmanager
def exclusive_lock(
    path: Path,
    wait_seconds: float,
    held_too_long: Callable[[], Exception],
    poll_seconds: float = 0.02,
) -> Iterator[None]:
    """Hold an exclusive `flock` on `path` (made, with its folder, if missing) for the block.

    Polls every `poll_seconds`; when another process still holds it after `wait_seconds`,
    raises the exception `held_too_long()` builds (it names the lock and the wait)."""
    deadline = time.monotonic() + wait_seconds
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as handle:
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise held_too_long() from None
                time.sleep(poll_seconds)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
