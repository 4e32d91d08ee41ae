"""A Python worker that misses Spark's start-up deadline does not fail the run.

Spark gives a Python worker it starts a fixed 10 s to connect back, and fails the whole
query if it is late, as happens on a busy machine: the process that plans a Python data
source's batches, and on Spark Connect the batch function's worker, which the server
starts as the query starts. Here ``PYSPARK_PYTHON`` is a wrapper that holds the first
start of such a worker for 13 s: a real late worker, in a real driver. The runner starts
the query again, from the checkpoint, and the output is exact.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from sparkonce.offsets import check_chain
from sparkonce.verify.driver import Driver
from tests.crash.conftest import (
    KEYS,
    PARTITIONS,
    RECORDS,
    STATELESS_TABLE,
    read_sink,
    run_driver,
    write_pipeline,
)

pytestmark = pytest.mark.crash_lane

_SLOW_PYTHON = """#!/usr/bin/env bash
# The first start of one kind of Python worker waits past Spark's 10 s deadline.
case "$*" in
  *{module}*)
    if mkdir {marker!r} 2>/dev/null; then sleep 13; fi ;;
esac
exec {python!r} "$@"
"""


@pytest.mark.parametrize(
    ("module", "remote", "retried"),
    [
        # The streaming source's planner, inside a query that already started.
        ("python_streaming_source_runner", (), "did not start in time"),
        # On Spark Connect the server starts the batch function's worker as the query
        # starts; late, it fails writeStream.start() itself, with another message. The
        # server is the local one that --remote local[2] starts, whose workers use the
        # wrapper.
        (
            "foreach_batch_worker",
            ("--remote", "local[2]"),
            "server's Python worker did not start in time",
        ),
    ],
    ids=["planner", "connect-foreach-batch"],
)
def test_a_late_worker_is_retried_and_the_output_is_exact(
    module: str,
    remote: tuple[str, ...],
    retried: str,
    tmp_path: Path,
    make_log: Callable[..., Path],
    drivers: list[Driver],
) -> None:
    log_dir = make_log(RECORDS, partitions=PARTITIONS, keys=KEYS)
    url = f"sqlite:///{tmp_path / 'sink.db'}"
    pipeline = write_pipeline(tmp_path, log_dir=log_dir, sink_url=url)
    wrapper = tmp_path / "slow-python"
    marker = tmp_path / "slowed-once"
    wrapper.write_text(
        _SLOW_PYTHON.format(module=module, marker=str(marker), python=sys.executable)
    )
    wrapper.chmod(0o755)

    driver = Driver(
        pipeline, tmp_path / "run.log", env={"PYSPARK_PYTHON": str(wrapper)}, extra_args=remote
    )
    drivers.append(driver)
    code = run_driver(driver)
    text = driver.log_path.read_text(errors="replace")
    assert marker.exists(), f"the wrapper never delayed a {module} start"
    assert code == 0, driver.log_tail(30)
    assert retried in text and "attempt 2 of 5" in text

    state = read_sink(url, STATELESS_TABLE)
    values = sorted(int(r["value"]) for r in state.rows)
    assert values == list(range(1, RECORDS + 1))  # every record once
    assert check_chain(e.ranges for e in state.ledger) == []
