"""DeltaSource in real driver processes (``sparkonce run FILE``) killed at protocol steps.

The source table is written here, on the shared session, before any driver starts: versions
0..3, each appending ids ``v*100 .. v*100+11`` in 3 files, and the pipeline reads 3 files a
batch, so batch ``n`` is version ``n``. The oracle is those ids, each once. Outputs are read
with readers of their own: pyarrow on the files a Delta table's log names, sqlite3.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from sparkonce.protocol import CrashPoint
from sparkonce.verify.driver import SIGKILL_EXIT, Driver
from tests.crash.conftest import replays_skipped, run_driver
from tests.delta.test_source import FILES, append_versions, delta_ids

VERSIONS = 4

_PIPELINE = '''"""A DeltaSource crash-test pipeline (tests/crash/test_delta_source_crash.py)."""

from sparkonce import DeltaSink, DeltaSource, Pipeline, sink_from_url

pipeline = Pipeline(
    name="delta-src",
    source=DeltaSource({table!r}, max_files_per_batch={files}{starting}),
    transform=lambda df: df.select("id", "k"),
    sink={sink},
    checkpoint={checkpoint!r},
)
'''


def write_pipeline(tmp_path: Path, table: Path, sink: str, starting: str = "") -> Path:
    path = tmp_path / "pipeline.py"
    path.write_text(
        _PIPELINE.format(
            table=str(table),
            files=FILES,
            starting=starting,
            sink=sink,
            checkpoint=str(tmp_path / "checkpoint"),
        )
    )
    return path


@pytest.mark.crash_lane
def test_delta_to_delta_killed_after_its_ledger_commit_then_rerun_is_exact(
    spark: SparkSession, tmp_path: Path, drivers: list[Driver]
) -> None:
    """SIGKILL after batch 1's Delta commit, before Spark's commit log: the rerun replays
    batch 1, skips it, reads on, and the output holds each input row once."""
    table = tmp_path / "bronze"
    expected = append_versions(spark, table, range(VERSIONS))
    silver = tmp_path / "tables"
    pipeline_file = write_pipeline(tmp_path, table, f'DeltaSink({str(silver)!r}, table="silver")')

    run1 = Driver(
        pipeline_file, tmp_path / "run1.log", crash_at=CrashPoint.AFTER_LEDGER_COMMIT, crash_hit=2
    )
    drivers.append(run1.start())
    code = run_driver(run1)
    assert code == SIGKILL_EXIT, f"run 1 exited with {code}, not SIGKILL:\n{run1.log_tail()}"
    assert delta_ids(silver / "silver") == expected[: 2 * 12], run1.log_tail()

    run2 = Driver(pipeline_file, tmp_path / "run2.log")
    drivers.append(run2.start())
    code = run_driver(run2)
    assert code == 0, f"run 2 exited with {code}:\n{run2.log_tail()}"
    assert replays_skipped(run2) == 1, run2.log_tail()
    assert delta_ids(silver / "silver") == expected, run2.log_tail()


@pytest.mark.crash_lane
def test_files_vacuumed_after_a_crash_stop_the_rerun_with_the_table_and_version(
    spark: SparkSession, tmp_path: Path, drivers: list[Driver]
) -> None:
    """SIGKILL before batch 1 commits (version 1 planned, not delivered); OPTIMIZE and VACUUM
    RETAIN 0 HOURS then remove version 1's files. The rerun must not skip them: it stops with
    the source's error naming the table and version 1, and the output keeps batch 0 only."""
    table = tmp_path / "bronze"
    expected = append_versions(spark, table, range(VERSIONS))
    db = tmp_path / "out.db"
    # From version 0's commit (not the snapshot), so that batch n is version n.
    sink = f'sink_from_url("sqlite:///{db}", "out")'
    pipeline_file = write_pipeline(tmp_path, table, sink, ", starting_version=0")

    run1 = Driver(
        pipeline_file, tmp_path / "run1.log", crash_at=CrashPoint.BEFORE_COMMIT, crash_hit=2
    )
    drivers.append(run1.start())
    code = run_driver(run1)
    assert code == SIGKILL_EXIT, f"run 1 exited with {code}, not SIGKILL:\n{run1.log_tail()}"

    spark.sql(f"OPTIMIZE delta.`{table}`").collect()
    check = "spark.databricks.delta.retentionDurationCheck.enabled"
    spark.conf.set(check, "false")
    try:
        spark.sql(f"VACUUM delta.`{table}` RETAIN 0 HOURS").collect()
    finally:
        spark.conf.unset(check)

    run2 = Driver(pipeline_file, tmp_path / "run2.log")
    drivers.append(run2.start())
    code = run_driver(run2)
    text = run2.log_path.read_text(errors="replace")
    assert code != 0, f"run 2 passed over vacuumed files:\n{run2.log_tail()}"
    named = f"DeltaSource(delta://{table} max_files_per_batch=3): a batch reading table version 1 "
    assert named in text, run2.log_tail(60)
    assert "needs data file" in text and "VACUUM removed it" in text, run2.log_tail(60)
    with sqlite3.connect(db) as conn:
        ids = sorted(int(r[0]) for r in conn.execute("SELECT id FROM out"))
    assert ids == expected[:12]
