"""``sparkonce run`` stops cleanly on SIGTERM and SIGINT, as under systemd or Kubernetes.

A live run (processing-time trigger) gets the signal in its Python process while it keeps
committing. It must stop between commits, print one line, exit with 128 + the signal's
number, and leave the sink such that the next run finishes with every record exactly once.
"""

from __future__ import annotations

import signal
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

from sparkonce.verify.driver import Driver
from tests.crash.conftest import read_sink, run_driver
from tests.crash.test_preflight import _wait_for, write_live_pipeline


@pytest.mark.parametrize(
    "sig",
    [
        pytest.param(signal.SIGTERM, marks=pytest.mark.crash_lane, id="SIGTERM"),
        # The same path (one handler for both): make test-campaign.
        pytest.param(signal.SIGINT, marks=pytest.mark.campaign_lane, id="SIGINT"),
    ],
)
def test_a_signal_stops_the_run_cleanly_and_the_next_run_resumes(
    sig: signal.Signals, tmp_path: Path, make_log: Callable[..., Path], drivers: list[Driver]
) -> None:
    pipeline_file, url = write_live_pipeline(tmp_path, make_log(400, partitions=2))

    def rows() -> list[dict]:
        return read_sink(url, "live_out").rows

    live = Driver(pipeline_file, tmp_path / "live.log")
    drivers.append(live.start())
    _wait_for("the first 400 rows", lambda: len(rows()) == 400, live)
    make_log(400, partitions=2, start=401)  # more input arrives while the signal lands
    time.sleep(0.5)
    live.proc.send_signal(sig)  # type: ignore[union-attr]  # the Python process only
    code = run_driver(live, timeout=120)
    log = live.log_path.read_text(errors="replace")
    assert code == 128 + sig, log
    last = log.strip().splitlines()[-1]
    assert last.startswith("sparkonce: stopped: ") and sig.name in last, log
    assert "Traceback" not in log, log

    again = Driver(pipeline_file, tmp_path / "again.log", extra_args=("--timeout", "25"))
    drivers.append(again.start())
    assert run_driver(again) == 0, again.log_tail()
    got = Counter(r["record_id"] for r in rows())
    assert len(got) == 800 and set(got.values()) == {1}, "lost or duplicated records"


@pytest.mark.crash_lane
def test_sigterm_to_the_whole_process_group_stops_with_one_line(
    tmp_path: Path, make_log: Callable[..., Path], drivers: list[Driver]
) -> None:
    """``timeout``, ``kill -- -PGID`` and systemd signal the whole group: Spark's JVM and its
    Python workers get SIGTERM too, and may go away before the driver's Python process
    handles it. The stop is the same: exit 143, one line, no traceback, data exact."""
    pipeline_file, url = write_live_pipeline(tmp_path, make_log(400, partitions=2))

    def rows() -> list[dict]:
        return read_sink(url, "live_out").rows

    live = Driver(pipeline_file, tmp_path / "live.log")  # a session (process group) of its own
    drivers.append(live.start())
    _wait_for("the first 400 rows", lambda: len(rows()) == 400, live)
    make_log(400, partitions=2, start=401)
    time.sleep(0.5)
    live.signal_group(signal.SIGTERM)  # the driver, its JVM and its Python workers
    code = run_driver(live, timeout=120)
    log = live.log_path.read_text(errors="replace")
    assert code == 128 + signal.SIGTERM, log
    lines = [ln for ln in log.strip().splitlines() if not ln.startswith("WARNING: Using incubator")]
    last = lines[-1]
    assert last.startswith("sparkonce: stopped: ") and "SIGTERM" in last, log
    assert "Traceback" not in log and "unexpected" not in log, log
    assert [ln for ln in lines if ln.startswith("sparkonce:")] == [last], log

    again = Driver(pipeline_file, tmp_path / "again.log", extra_args=("--timeout", "25"))
    drivers.append(again.start())
    assert run_driver(again) == 0, again.log_tail()
    got = Counter(r["record_id"] for r in rows())
    assert len(got) == 800 and set(got.values()) == {1}, "lost or duplicated records"
