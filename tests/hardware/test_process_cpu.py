"""CPU seconds of a process tree (`bench scale` accounts its workers and servers with them)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from market_pipeline.hardware.process_tree import server_cpu_seconds, tree_cpu_seconds

# The root burns 0.4 CPU-seconds, has a child burn 0.4 and waits for it (reaped), then starts a
# second child that burns 0.4, says "ready" on the root's stdout and stays until its stdin ends;
# the root waits for a line on its own stdin.
TREE = textwrap.dedent(
    """
    import subprocess, sys, time
    BURN = "import time\\nwhile time.process_time() < 0.4: pass\\n"
    while time.process_time() < 0.4:
        pass
    subprocess.run([sys.executable, "-c", BURN], check=True)
    live = subprocess.Popen(
        [sys.executable, "-c", BURN + "print('ready', flush=True)\\nimport sys\\nsys.stdin.read()"],
        stdin=subprocess.PIPE,
    )
    sys.stdin.readline()
    live.communicate(b"")
    """
)


def test_a_tree_counts_itself_its_reaped_children_and_its_live_ones() -> None:
    root = subprocess.Popen(
        [sys.executable, "-c", TREE], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert root.stdout is not None and root.stdout.readline().strip() == "ready"
        seconds = tree_cpu_seconds(root.pid)
    finally:
        root.communicate("\n", timeout=60)
    # 0.4 each (a burn counts its own start-up): without the reaped or the live child, 0.8 at most
    assert seconds >= 1.1, seconds
    assert tree_cpu_seconds(root.pid) == 0.0  # gone


def test_no_server_of_that_name_spends_nothing() -> None:
    assert server_cpu_seconds("no-such-server-here") == 0.0
