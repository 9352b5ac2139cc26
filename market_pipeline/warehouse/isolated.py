"""A hand-typed query in its own process, bounded there and not only by DuckDB's settings.

DuckDB's `memory_limit` covers its buffer manager, not every allocation: one
`repeat('x', 4000000000)` took 8 GB under a 1 GB limit, and its interrupt is only looked at
between steps, so a 20 s limit ran 34 s. So `sql` and `tenant-sql` run the query in a
spawned child process that

- caps its own address space (RLIMIT_AS) at the most it held once its libraries were loaded
  plus `ADDRESS_SPACE_PER_MB` x the query's memory limit plus a fixed headroom: an allocation
  past it fails inside the child, never in the caller. Address space is not resident memory:
  DuckDB's and polars' allocators reserve ahead, about 2x what they touch (2M rows as JSON:
  827 MB resident, 1.7 GB more address space), so the cap allows twice the limit;
- turns the result into what the caller prints (a table or JSON text) there, so a value a
  library cannot show (an infinite timestamp panics polars) fails in the child, and sends back
  at most `max_result_mb` of it, or a refusal naming the limit;
- runs under one wall clock that starts when the caller starts the child: the child's DuckDB
  interrupt fires at the time limit counted from there (starting the interpreter and waiting
  on a writer's lock included), and the caller kills the child (SIGKILL) `KILL_GRACE_SECONDS`
  later if that interrupt has not stopped it;
- is spawned (not forked: DuckDB's threads do not survive a fork), so like any spawned child it
  imports the caller's `__main__`: a script that calls the CLI's `main()` must guard it with
  `if __name__ == "__main__":` (the installed command and `python -m market_pipeline.cli` do);
- writes nothing to the terminal: its stderr goes to /dev/null, so a library's panic text or
  abort message never reaches the user; the caller reports one line.
"""

from __future__ import annotations

import contextlib
import dataclasses
import multiprocessing
import os
import resource
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

from market_pipeline.warehouse.sql_guard import SqlLimits, SqlRefused

MB = 1024 * 1024
# Address space a query may take beyond its memory limit: thread stacks, malloc arenas,
# the result's copy on its way out.
HEADROOM_MB = 256
ADDRESS_SPACE_PER_MB = 2
KILL_GRACE_SECONDS = 1.5

Target = Callable[..., str]


def _peak_address_space_bytes() -> int:
    """The most address space this process has held so far (VmPeak)."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmPeak:"):
                return int(line.split()[1]) * 1024
    raise OSError("no VmPeak in /proc/self/status")


def _cap_address_space(limit_mb: int) -> None:
    try:
        ceiling = _peak_address_space_bytes() + (ADDRESS_SPACE_PER_MB * limit_mb + HEADROOM_MB) * MB
    except OSError:  # no /proc: cap at the limit plus a generous interpreter allowance
        ceiling = (ADDRESS_SPACE_PER_MB * limit_mb + HEADROOM_MB + 2048) * MB
    resource.setrlimit(resource.RLIMIT_AS, (ceiling, ceiling))


# How an allocation refused at the cap reads, by library: DuckDB, C++, PyO3 (polars).
_OUT_OF_MEMORY = (
    "out of memory",
    "bad_alloc",
    "bad allocation",
    "failed to allocate",
    "pyobject pointer is null",
    # a thread's stack is address space too: at the cap a library cannot start its threads
    "can't start new thread",
    "resource temporarily unavailable",
)


def _out_of_memory(text: str) -> bool:
    lowered = text.lower()
    return any(mark in lowered for mark in _OUT_OF_MEMORY)


def _first_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split("\n")[0].split())
    return text[:300] or type(exc).__name__


def _child(
    conn: Connection, target: Target, args: tuple[Any, ...], limits: SqlLimits, deadline: float
) -> None:
    """The child's whole life: cap itself, run `target`, send ("ok", text) or ("refused", line).
    `deadline` is on the monotonic clock, which Linux shares between processes."""
    with open(os.devnull, "wb") as devnull:
        os.dup2(devnull.fileno(), 2)
    # a Rust panic (polars) would otherwise symbolise a backtrace nobody reads: slow, and
    # memory the query's cap does not allow
    os.environ["RUST_BACKTRACE"] = "0"
    os.environ["RUST_LIB_BACKTRACE"] = "0"
    try:
        _cap_address_space(limits.memory_limit_mb)
        left = max(deadline - time.monotonic(), 0.05)
        payload = target(
            *args,
            limits=dataclasses.replace(limits, timeout_seconds=left),
            on_start=lambda: conn.send(("started", None)),
        )
        if len(payload) > limits.max_result_mb * MB:
            raise SqlRefused(
                f"the result is larger than the {limits.max_result_mb} MB result limit; add a LIMIT or select less"
            )
        conn.send(("ok", payload))
    except MemoryError:
        conn.send(("refused", _memory_message(limits)))
    except BaseException as exc:  # a library's panic included: one line back, never a traceback
        text = _first_line(exc)
        if _out_of_memory(text):
            text = _memory_message(limits)
        elif isinstance(exc, (SqlRefused, ValueError)):  # the query's own refusal, already one line
            if "time limit" in text:  # the child's interrupt ran on what was left of the limit
                text = f"the query ran past the {limits.timeout_seconds:g} s time limit"
        elif type(exc).__name__ == "PanicException":
            text = f"the result holds a value that cannot be shown ({text}); cast it to VARCHAR"
        else:
            text = f"query failed: {type(exc).__name__}: {text}"
        with contextlib.suppress(BaseException):
            conn.send(("refused", text))


def _memory_message(limits: SqlLimits) -> str:
    return f"the query needs more memory than the {limits.memory_limit_mb} MB limit"


def run_isolated(target: Target, args: tuple[Any, ...], limits: SqlLimits) -> str:
    """`target(*args, limits=..., on_start=...)` in a bounded child process: the text it renders, or
    SqlRefused with one line (a limit broken, the query's own error, or the child's death).
    `target` is a module-level function (the child imports it by name)."""
    context = multiprocessing.get_context("spawn")
    receive, send = context.Pipe(duplex=False)
    deadline = time.monotonic() + limits.timeout_seconds
    process = context.Process(target=_child, args=(send, target, args, limits, deadline), daemon=True)
    process.start()
    send.close()
    try:
        return _await(process, receive, limits, deadline + KILL_GRACE_SECONDS)
    finally:
        if process.is_alive():
            process.kill()
        process.join(5)
        receive.close()


def _await(
    process: multiprocessing.process.BaseProcess, receive: Connection, limits: SqlLimits, kill_at: float
) -> str:
    started = False
    while True:
        left = kill_at - time.monotonic()
        if left <= 0:
            if started:
                raise SqlRefused(f"the query ran past the {limits.timeout_seconds:g} s time limit")
            raise SqlRefused(
                f"the query did not start within the {limits.timeout_seconds:g} s time limit"
                " (the warehouse may be locked by a writer)"
            )
        try:
            ready = receive.poll(min(left, 0.5))
        except (EOFError, OSError):
            ready = False
        if not ready:
            if not process.is_alive() and not receive.poll(0):
                raise SqlRefused(_death_message(process.exitcode, limits))
            continue
        try:
            kind, payload = receive.recv()
        except (EOFError, OSError):
            raise SqlRefused(_death_message(process.exitcode, limits)) from None
        if kind == "started":
            started = True
        elif kind == "ok":
            return str(payload)
        else:
            raise SqlRefused(payload)


def _death_message(exitcode: int | None, limits: SqlLimits) -> str:
    # a child that dies without a word ran out of its address space inside native code
    return (
        f"the query process ended without a result (exit {exitcode}); it most likely needed more"
        f" memory than the {limits.memory_limit_mb} MB limit"
    )
