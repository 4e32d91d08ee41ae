"""Kills on the standalone cluster: the driver at a named step of the commit protocol, and
one executor JVM in the middle of a batch whose tasks pre-commit into PostgreSQL.

Both end with the sink holding every record of the log exactly once, in one gap-free
ledger, as a run without the kill would leave it.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from sparkonce.protocol import CRASH_ENV, CrashPoint
from tests.cluster.conftest import StartDriver, sparkonce_run
from tests.cluster.pipelines import (
    BATCHES,
    KEYS,
    PARTITIONS,
    RECORDS,
    ROWS_PER_BATCH,
    log_events,
    markers,
    running_task_after_first_batch,
    sink_events,
    sink_rows,
    write_pipeline,
)
from tests.services.spark_cluster import SparkCluster

pytestmark = pytest.mark.campaign_lane

ROW_SECONDS = 0.01  # a task (200 rows) takes about 2 s, so a kill lands inside one
WAIT_S = 240.0


def _exact(sink_url: str, log_dir: Path) -> None:
    rows, ledger = sink_rows(sink_url)
    assert sink_events(rows) == log_events(log_dir)  # none lost, none twice
    assert [(e.seq, e.row_count) for e in ledger] == [(i, ROWS_PER_BATCH) for i in range(BATCHES)]


def test_driver_killed_after_its_ledger_commit_recovers_exactly(
    spark_cluster: SparkCluster,
    start_driver: StartDriver,
    make_log: Callable[..., Path],
    tmp_path: Path,
) -> None:
    log_dir = make_log(RECORDS, partitions=PARTITIONS, keys=KEYS)
    sink_url = f"sqlite:///{tmp_path / 'sink.db'}"
    pipeline_file = write_pipeline(
        tmp_path / "pipeline.py", log_dir=log_dir, sink_url=sink_url, markers=tmp_path / "m"
    )
    # The second batch commits into the sink, and the driver dies (its whole process group,
    # the driver JVM included) before Spark records the batch as done.
    first = start_driver(
        sparkonce_run(pipeline_file, spark_cluster, tmp_path / "spark-1.log"),
        name="killed",
        env={CRASH_ENV: f"{CrashPoint.AFTER_LEDGER_COMMIT}@2"},
    )
    assert first.wait() == -signal.SIGKILL, first.tail()
    assert [e.seq for e in sink_rows(sink_url)[1]] == [0, 1]
    # The master drops the dead driver's application and its executors.
    deadline = time.monotonic() + 60
    while spark_cluster.executors() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not spark_cluster.executors(), spark_cluster.executors()

    second = start_driver(
        sparkonce_run(pipeline_file, spark_cluster, tmp_path / "spark-2.log"), name="restart"
    )
    assert second.wait() == 0, second.tail()
    # Spark replays batch 1 from its offset log; the ledger has it, so it is skipped.
    assert "resumed from checkpoint" in second.tail(), second.tail()
    assert f"committed {BATCHES - 2} batches" in second.tail(), second.tail()
    assert "skipped 1 replayed batches" in second.tail(), second.tail()
    _exact(sink_url, log_dir)


def test_executor_killed_mid_batch_two_phase_sink_stays_exact(
    spark_cluster: SparkCluster,
    start_driver: StartDriver,
    make_log: Callable[..., Path],
    pg_url: str,
    tmp_path: Path,
) -> None:
    log_dir = make_log(RECORDS, partitions=PARTITIONS, keys=KEYS)
    marker_dir = tmp_path / "markers"
    pipeline_file = write_pipeline(
        tmp_path / "pipeline.py",
        log_dir=log_dir,
        sink_url=pg_url,
        markers=marker_dir,
        row_seconds=ROW_SECONDS,
        two_phase=True,
    )
    driver = start_driver(sparkonce_run(pipeline_file, spark_cluster, tmp_path / "spark.log"))
    running = running_task_after_first_batch(marker_dir, time.monotonic() + WAIT_S)
    # The executor whose working directory the task runs in: SIGKILL its JVM alone (the
    # worker stays, and starts a new executor).
    victim = next(
        e
        for e in spark_cluster.executors()
        if Path(os.readlink(f"/proc/{e.pid}/cwd")) == Path(running["cwd"])
    )
    os.kill(victim.pid, signal.SIGKILL)
    assert driver.wait() == 0, driver.tail()
    _exact(pg_url, log_dir)
    retried = [
        m
        for m in markers(marker_dir)
        if (m["stage"], m["partition"]) == (running["stage"], running["partition"])
        and m["attempt"] > running["attempt"]
    ]
    assert retried, f"the killed task {running} never ran again: {markers(marker_dir)}"
    log_text = (tmp_path / "spark.log").read_text(errors="replace")
    assert "Lost executor" in log_text or "ExecutorLostFailure" in log_text, log_text[-3000:]
