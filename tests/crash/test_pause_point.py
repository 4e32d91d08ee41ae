"""``SPARKONCE_PAUSE_AT`` must stop the thread that reaches the pause point, right there.

The driver reaches crash points on a py4j callback thread (``foreachBatch``) while its main
thread waits in ``awaitTermination``. A process-directed ``os.kill(os.getpid(), SIGSTOP)`` is
handed to the main thread, and the group stop starts only once that thread gets a CPU; until then
the calling thread ran on past the pause point, into the commit transaction, and was stopped
holding the store's write lock (the newer run then failed with "database is locked").
``crash_point`` therefore uses ``signal.pthread_kill(threading.get_ident(), SIGSTOP)``, which
stops the calling thread before it returns (and still stops the whole process). This test
guards that.

The test makes "the main thread does not get a CPU at once" deterministic: the child is pinned
to one CPU and its main thread runs under SCHED_IDLE, so the woken main thread cannot preempt
the worker. The worker writes a marker file right after the pause point; if the marker exists
while the process is stopped, the worker ran past the point.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.crash.conftest import process_state

_CHILD = """
import os, sys, threading, time
from pathlib import Path

os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})  # one CPU, inherited by the worker
os.environ["SPARKONCE_PAUSE_AT"] = "before-commit"
from sparkonce.faults import FaultPlan
from sparkonce.protocol import CrashPoint
crash_point = FaultPlan.from_env().crash_point

marker = Path(sys.argv[1])
go = threading.Event()


def worker():
    go.wait()
    crash_point(CrashPoint.BEFORE_COMMIT)
    marker.write_text("ran past the pause point")
    time.sleep(60)


t = threading.Thread(target=worker, name="callback")
t.start()
os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))  # this (main) thread only
go.set()
t.join()
"""


def test_pause_stops_the_calling_thread_at_once(tmp_path: Path) -> None:
    script = tmp_path / "child.py"
    script.write_text(_CHILD)
    marker = tmp_path / "marker"
    proc = subprocess.Popen(
        [sys.executable, str(script), str(marker)],
        start_new_session=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 30
        while process_state(proc.pid) != "T":
            if proc.poll() is not None:
                out = proc.stdout.read().decode(errors="replace") if proc.stdout else ""
                pytest.fail(f"child exited with {proc.returncode} before pausing:\n{out}")
            assert time.monotonic() < deadline, "child did not pause within 30 s"
            time.sleep(0.01)
        time.sleep(0.2)  # the stopped process can do nothing more; give a slow disk a moment
        assert not marker.exists(), "the calling thread ran past the pause point before stopping"
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        if proc.stdout:
            proc.stdout.close()
