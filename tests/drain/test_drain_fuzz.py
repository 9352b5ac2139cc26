"""Hypothesis over `drain`'s arguments: every refused command gets one error line, exit 2,
no traceback, no signal, and nothing written (no warehouse, registry, lease or journal)."""

from __future__ import annotations

import math
import os
import tempfile
from pathlib import Path

import psutil
import pytest
from drain_targets import cli, start_target
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from market_pipeline.drain.commands import MAX_DRAIN_SECONDS, _pid_max

FLAGS = ("--warn-seconds", "--timeout-seconds", "--checkpoint-timeout-seconds")
# capsys is read (and so reset) once per example.
FUZZ = settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)


def _valid_seconds(text: str) -> bool:
    try:
        value = float(text)
    except ValueError:
        return False
    return math.isfinite(value) and 0 < value <= MAX_DRAIN_SECONDS


def _drainable(text: str) -> bool:
    """Whether the text names a pid the command could act on (never generated as 'bad')."""
    text = text.strip()
    return text.isascii() and text.isdigit() and len(text) <= 10 and 1 <= int(text) <= _pid_max()


PROTECTED = sorted({1, os.getpid(), *(p.pid for p in psutil.Process().parents())})
bad_pids = st.one_of(
    st.text(max_size=24).filter(lambda t: not _drainable(t)),
    st.integers(max_value=0).map(str),
    st.integers(min_value=_pid_max() + 1, max_value=10**30).map(str),
    st.integers(min_value=11, max_value=6000).map(lambda n: "7" * n),  # up to past int()'s cap
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.sampled_from([str(p) for p in PROTECTED]),  # refused although they exist
)
bad_seconds = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True)
    .filter(lambda v: not (math.isfinite(v) and 0 < v <= MAX_DRAIN_SECONDS))
    .map(repr),
    st.sampled_from(["nan", "inf", "-inf", "0", "-0", "1e400", "-1", "", " ", "1s", "0x10"]),
    st.text(max_size=12).filter(lambda t: not _valid_seconds(t)),
)
any_seconds = st.one_of(bad_seconds, st.floats(0.001, 5).map(repr))


@pytest.fixture(scope="module")
def home():
    with tempfile.TemporaryDirectory() as tmp:
        saved = os.environ.get("MARKET_PIPELINE_HOME")
        os.environ["MARKET_PIPELINE_HOME"] = tmp
        yield Path(tmp)
        if saved is None:
            os.environ.pop("MARKET_PIPELINE_HOME")
        else:
            os.environ["MARKET_PIPELINE_HOME"] = saved


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    target = start_target(tmp_path_factory.mktemp("fuzz-target"))
    yield target
    target.cleanup()


def refused(home: Path, argv: list[str], capsys) -> str:
    rc = cli(argv)  # an exception here (a traceback) fails the test
    captured = capsys.readouterr()
    assert rc == 2, (argv, captured)
    assert captured.out == "" and "Traceback" not in captured.err
    assert captured.err.startswith("error: ") and captured.err.count("\n") == 1, captured.err
    assert [p for p in home.rglob("*")] == [], "a refused command wrote files"
    return captured.err


@FUZZ
@given(
    pid=bad_pids,
    seconds=st.lists(any_seconds, min_size=3, max_size=3),
    given_flags=st.lists(st.booleans(), min_size=3, max_size=3),
)
def test_fuzz_drain_refuses_a_bad_pid(home, capsys, pid, seconds, given_flags):
    argv = ["drain", "--backend", "local-process", f"--pid={pid}", "--audit", "memory"]
    argv += [f"{f}={v}" for f, v, on in zip(FLAGS, seconds, given_flags) if on]
    refused(home, argv, capsys)


@FUZZ
@given(bad=bad_seconds, which=st.sampled_from(FLAGS), others=st.lists(any_seconds, min_size=2, max_size=2))
def test_fuzz_drain_refuses_a_bad_duration_of_a_live_pid(home, target, capsys, bad, which, others):
    rest = [f for f in FLAGS if f != which]
    argv = ["drain", "--backend", "local-process", f"--pid={target.pids[0]}", f"{which}={bad}"]
    argv += [f"{f}={v}" for f, v in zip(rest, others)]
    refused(home, argv, capsys)
    assert not target.signals() and target.left() == target.pids


@FUZZ
@given(
    tenant=st.one_of(
        st.just(""),
        st.text(min_size=129, max_size=200),
        st.text(min_size=1, max_size=20).filter(lambda t: not t.isprintable()),
    )
)
def test_fuzz_drain_refuses_a_bad_tenant(home, target, capsys, tenant):
    argv = [
        "drain",
        "--backend",
        "local-process",
        f"--pid={target.pids[0]}",
        "--warn-seconds=0.1",
        "--timeout-seconds=0.1",
        f"--tenant-id={tenant}",
    ]
    assert "--tenant-id must be" in refused(home, argv, capsys)
    assert not target.signals()


@FUZZ
@given(decision=st.text(max_size=30), flag=st.sampled_from(FLAGS), value=any_seconds)
def test_fuzz_drain_decision_refuses_pid_timing(home, capsys, decision, flag, value):
    argv = ["drain", f"--decision-id={decision}", f"{flag}={value}"]
    refused(home, argv, capsys)


@FUZZ
@given(decision=st.text(max_size=30))
def test_fuzz_drain_refuses_an_unknown_decision_without_a_warehouse(home, capsys, decision):
    assert "no drain decision with id" in refused(home, ["drain", f"--decision-id={decision}"], capsys)
