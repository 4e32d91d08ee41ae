"""A worker dies (SIGKILL to its JVM and its whole process group: its executor and that
executor's Python workers, as when a machine fails) while a batch's task runs on it. Spark
runs the lost task again on the other worker, the query finishes, and the sink holds every
record exactly once. Then a replacement worker joins the cluster.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest

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
from tests.services.spark_cluster import SparkCluster, Worker

pytestmark = pytest.mark.campaign_lane

# 10 ms per row: a task (LIMIT rows) takes about 2 s, so the kill lands inside one.
ROW_SECONDS = 0.01
WAIT_S = 240.0


def _worker_at(cluster: SparkCluster, cwd: str) -> Worker:
    """The worker whose work dir holds a task's working directory."""
    return next(w for w in cluster.workers if Path(cwd).is_relative_to(w.workdir))


def test_query_survives_a_worker_killed_mid_batch(
    spark_cluster: SparkCluster,
    start_driver: StartDriver,
    make_log: Callable[..., Path],
    tmp_path: Path,
) -> None:
    log_dir = make_log(RECORDS, partitions=PARTITIONS, keys=KEYS)
    sink_url = f"sqlite:///{tmp_path / 'sink.db'}"
    marker_dir = tmp_path / "markers"
    pipeline_file = write_pipeline(
        tmp_path / "pipeline.py",
        log_dir=log_dir,
        sink_url=sink_url,
        markers=marker_dir,
        row_seconds=ROW_SECONDS,
    )
    spark_log = tmp_path / "spark.log"
    driver = start_driver(sparkonce_run(pipeline_file, spark_cluster, spark_log))
    deadline = time.monotonic() + WAIT_S
    running = running_task_after_first_batch(marker_dir, deadline)
    victim = _worker_at(spark_cluster, running["cwd"])
    survivors = [w for w in spark_cluster.workers if w.alive and w is not victim]
    killed = spark_cluster.kill_worker(victim.index)
    killed_at = time.time()
    assert running["pid"] in killed, (running, killed)  # the task's Python worker died too
    assert driver.proc.poll() is None, f"the driver ended with the worker:\n{driver.tail()}"

    code = driver.wait()
    assert code == 0, driver.tail()
    assert f"committed {BATCHES} batches ({RECORDS} rows)" in driver.tail(), driver.tail()
    rows, ledger = sink_rows(sink_url)
    assert sink_events(rows) == log_events(log_dir)  # every record once: none lost, none twice
    assert [(e.seq, e.row_count) for e in ledger] == [(i, ROWS_PER_BATCH) for i in range(BATCHES)]

    # Spark saw the executor go, and ran the lost task again on the surviving worker.
    log_text = spark_log.read_text(errors="replace")
    assert "ExecutorLostFailure" in log_text or "Lost executor" in log_text, log_text[-3000:]
    retries = [
        m
        for m in markers(marker_dir)
        if (m["stage"], m["partition"]) == (running["stage"], running["partition"])
        and m["attempt"] > running["attempt"]
    ]
    assert retries, f"task {running} was not run again: {markers(marker_dir)}"
    assert all(_worker_at(spark_cluster, m["cwd"]) in survivors for m in retries), retries
    # After the kill, only the survivors ran tasks.
    later = [m for m in markers(marker_dir) if m["at"] > killed_at + 1.0]
    assert all(_worker_at(spark_cluster, m["cwd"]) in survivors for m in later), later

    # A replacement joins; the killed worker stays DEAD in the master's list.
    replacement = spark_cluster.start_worker()
    assert replacement.port in spark_cluster.alive_worker_ports()
    assert victim.port not in spark_cluster.alive_worker_ports()
