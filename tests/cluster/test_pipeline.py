"""``sparkonce run --master spark://...``: a real pipeline (embedded log -> SQLite) on the
standalone cluster commits every record exactly once, its rows made by the executors'
shipped Python on both workers.

Where the embedded log is read: the log is one SQLite file, and the source opens it in
three kinds of process, all on the driver's machine but one. The driver process itself
(``sparkonce run``) opens it to check the topic before the query starts. The planning half
of the source (initial and latest offsets, a batch's ranges) runs in Python workers that
the *driver's* JVM starts (``./environment/bin/python`` in the driver's directory). The
read of each range runs in the executors' Python workers. On this one-machine cluster the
path exists for all of them; on a real cluster the log's directory must be reachable at
the same path from the driver and from every executor (a shared filesystem), or the read
tasks fail. The test records every ``sqlite3.connect`` of every Python process through
tests/cluster/sqlite_audit and checks these three.
"""

from __future__ import annotations

import json
import os
import sys
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
    TOPIC,
    log_events,
    sink_events,
    sink_rows,
    write_pipeline,
)
from tests.services.spark_cluster import ENV_NAME, SparkCluster

pytestmark = pytest.mark.campaign_lane

AUDIT_DIR = Path(__file__).with_name("sqlite_audit")
AUDIT_ENV = "SPARKONCE_TEST_SQLITE_AUDIT"


def test_pipeline_on_the_cluster_commits_each_record_once(
    spark_cluster: SparkCluster,
    start_driver: StartDriver,
    make_log: Callable[..., Path],
    driver_dir: Path,
    tmp_path: Path,
) -> None:
    log_dir = make_log(RECORDS, partitions=PARTITIONS, keys=KEYS)
    sink_url = f"sqlite:///{tmp_path / 'sink.db'}"
    pipeline_file = write_pipeline(
        tmp_path / "pipeline.py", log_dir=log_dir, sink_url=sink_url, markers=tmp_path / "m"
    )
    audit = tmp_path / "sqlite-audit.jsonl"
    driver = start_driver(
        sparkonce_run(pipeline_file, spark_cluster, tmp_path / "spark.log"),
        # Every Python worker Spark starts, on executors and on the driver's side, gets the
        # audit hook; so does the driver process.
        settings={
            "spark.executorEnv.PYTHONPATH": str(AUDIT_DIR),
            f"spark.executorEnv.{AUDIT_ENV}": str(audit),
        },
        env={"PYTHONPATH": str(AUDIT_DIR), AUDIT_ENV: str(audit)},
    )
    assert driver.wait() == 0, driver.tail()
    assert f"committed {BATCHES} batches ({RECORDS} rows)" in driver.tail(), driver.tail()

    # Exactly the log's records, each once, in BATCHES ledger entries.
    rows, ledger = sink_rows(sink_url)
    expected = log_events(log_dir)
    assert len(expected) == RECORDS
    assert sink_events(rows) == expected
    assert [(e.seq, e.row_count) for e in ledger] == [(i, ROWS_PER_BATCH) for i in range(BATCHES)]

    # Every row was made by the shipped interpreter of an executor, on both workers.
    worker_dirs = {w.workdir for w in spark_cluster.workers if w.alive}
    seen = set()
    for python in {str(r["python"]) for r in rows}:
        path = Path(python)
        assert path.parts[-3:] == (ENV_NAME, "bin", "python"), python
        seen |= {d for d in worker_dirs if path.is_relative_to(d)}
    assert seen == worker_dirs

    # Who opened the log's SQLite file.
    database = str(log_dir / f"{TOPIC}.db")
    opens = [json.loads(line) for line in audit.read_text().splitlines()]
    log_opens = [o for o in opens if os.path.realpath(o["database"]) == os.path.realpath(database)]
    driver_process = [o for o in log_opens if o["executable"] == sys.executable]
    driver_side = [
        o for o in log_opens if Path(o["cwd"]) == driver_dir and ENV_NAME in o["executable"]
    ]
    executors = [o for o in log_opens if any(Path(o["cwd"]).is_relative_to(d) for d in worker_dirs)]
    where = json.dumps(log_opens, indent=1)
    assert driver_process, f"the driver process never opened the log: {where}"
    assert driver_side, f"no Python worker of the driver's JVM opened the log: {where}"
    assert executors, f"no executor's Python worker opened the log: {where}"
    assert len(driver_process) + len(driver_side) + len(executors) == len(log_opens), where
    # The sink's file is the driver's alone: SQLiteSink commits from the driver.
    sink_opens = [o for o in opens if o["database"].endswith("sink.db")]
    assert sink_opens and all(o["executable"] == sys.executable for o in sink_opens), sink_opens
